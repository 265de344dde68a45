"""StepCompiler's bound on traffic's signatures, with a counting stand-in for XLA (the real
engine's compiles are covered in tests/test_engine_compiles.py)."""

import json
from dataclasses import astuple, dataclass

from replicas.engine.compiler import StepCompiler


@dataclass(frozen=True, order=True)
class Width:
    tokens: int

    def covers(self, other: "Width") -> bool:
        return self.tokens >= other.tokens

    def astuple(self) -> tuple[int, ...]:
        return astuple(self)

    @property
    def cost(self) -> int:
        return self.tokens

    def cost_for(self, exact: "Width") -> int:
        return self.tokens


def counting_compiler(record=None, max_traffic=2, nested=None):
    built = []

    def build(kind, dims):
        if nested and kind == "items":  # an items step needs its prefix step compiled
            compiler.ensure("prefix", Width(dims.tokens))
        built.append((kind, dims.tokens))
        return f"{kind}{dims.tokens}"

    compiler = StepCompiler(
        build,
        {"items": Width, "prefix": Width},
        background=False,
        record=record,
        max_traffic=max_traffic,
    )
    return compiler, built


def test_traffic_signatures_beyond_the_bound_are_dropped_least_recently_used_first():
    compiler, built = counting_compiler(max_traffic=2)
    compiler.ensure("items", Width(64), "warmup")  # warm-up: kept for good
    for tokens in (16, 32):
        compiler.resolve("items", Width(tokens))  # nothing smaller covers: request path
    compiler.resolve("items", Width(16))  # 16 is now more recent than 32
    compiler.resolve("items", Width(48))  # a third: 32 goes
    assert set(compiler.executables()) == {("items", Width(d)) for d in (64, 16, 48)}
    assert compiler.counts["evicted"] == 1
    assert compiler.resolve("items", Width(32)) == Width(32)  # compiled again when needed
    assert ("items", Width(64)) in compiler.executables()  # warm-up's are never dropped
    assert built.count(("items", 32)) == 2


def test_a_step_another_compile_needed_is_kept_and_the_record_forgets_what_was_dropped(tmp_path):
    record = tmp_path / "signatures.json"
    compiler, _ = counting_compiler(record, max_traffic=1, nested=True)
    for tokens in (16, 32, 48):
        compiler.resolve("items", Width(tokens))
    kept = set(compiler.executables())
    assert kept == {("items", Width(48))} | {("prefix", Width(d)) for d in (16, 32, 48)}
    listed = {(e["kind"], e["dims"][0]) for e in json.loads(record.read_text())}
    assert listed == {("items", 48)} | {("prefix", d) for d in (16, 32, 48)}


def test_a_dropped_executable_asked_for_again_compiles_on_the_request_path():
    compiler, _ = counting_compiler(max_traffic=1)
    chosen = compiler.resolve("items", Width(16))
    compiler.resolve("items", Width(32))  # evicts 16 between a resolve and its run
    assert compiler.executable("items", chosen) == "items16"
    assert compiler.counts["request_path"] == 3


def test_zero_means_unbounded():
    compiler, _ = counting_compiler(max_traffic=0)
    for tokens in range(1, 40):
        compiler.resolve("items", Width(tokens))
    assert len(compiler) == 39 and compiler.counts["evicted"] == 0


def test_at_the_bound_a_background_compile_waits_until_a_signature_has_been_idle():
    now = [0.0]
    built = []

    def build(kind, dims):
        built.append(dims.tokens)
        return f"{kind}{dims.tokens}"

    compiler = StepCompiler(
        build, {"items": Width}, max_traffic=2, idle_s=600.0, clock=lambda: now[0]
    )
    compiler.ensure("items", Width(1000), "warmup")  # covers everything below
    for tokens in (10, 20):  # traffic fills the bound in the background
        assert compiler.resolve("items", Width(tokens)) == Width(1000)
        assert compiler.wait_idle(30)
    now[0] = 300.0
    compiler.resolve("items", Width(20))  # 20 ran at 300 s, 10 last ran at 0 s
    assert compiler.resolve("items", Width(30)) == Width(1000)  # 10 idle 300 s: no compile
    assert compiler.wait_idle(30) and built == [1000, 10, 20]
    assert compiler.counts["declined"] == 1
    now[0] = 600.0  # now 10 has been idle for 600 s: 30 compiles and evicts it
    compiler.resolve("items", Width(30))
    assert compiler.wait_idle(30) and built == [1000, 10, 20, 30]
    assert set(compiler.executables()) == {("items", Width(d)) for d in (1000, 20, 30)}
