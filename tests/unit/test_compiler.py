"""StepCompiler's bound on traffic's signatures, with a counting stand-in for XLA (the real
engine's compiles are covered in tests/engine/test_engine_compiles.py)."""

import json
import threading
from dataclasses import astuple, dataclass

from cluster.niceness import thread_niceness
from replicas.engine.compiler import BACKGROUND_NICENESS, StepCompiler


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


def test_traffic_signatures_beyond_the_bound_are_dropped_least_valuable_first():
    compiler, built = counting_compiler(max_traffic=2)
    compiler.ensure("items", Width(64), "warmup")  # warm-up: kept for good
    for tokens in (16, 32):
        compiler.resolve("items", Width(tokens))  # nothing compiled is smaller: request path
    compiler.resolve("items", Width(16))  # 16 now has two uses, 32 one
    compiler.resolve("items", Width(48))  # a third: 32 is worth the least and goes
    assert set(compiler.executables()) == {("items", Width(d)) for d in (64, 16, 48)}
    assert compiler.counts["evicted"] == 1 and compiler.counts["evicted_one_off"] == 1
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


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def background_compiler(max_traffic=2, record=None, clock=None):
    """A compiler whose warm-up compiled ``Width(1000)``, which covers every other width."""
    built = []

    def build(kind, dims):
        built.append(dims.tokens)
        return f"{kind}{dims.tokens}"

    clock = clock or Clock()
    compiler = StepCompiler(
        build, {"items": Width}, max_traffic=max_traffic, record=record, clock=clock
    )
    compiler.ensure("items", Width(1000), "warmup")
    return compiler, built, clock


def run(compiler, tokens):
    """A request of ``tokens``: what it ran on, after any background compile it started."""
    chosen = compiler.resolve("items", Width(tokens))
    assert compiler.wait_idle(30)
    return chosen.tokens


def test_a_one_off_shape_never_compiles_and_a_recurring_one_compiles_in_the_background():
    compiler, built, clock = background_compiler()
    assert run(compiler, 10) == 1000  # first sight: runs covered, nothing compiles
    assert built == [1000] and compiler.counts["declined_one_off"] == 1
    clock.now += 60
    assert run(compiler, 10) == 1000  # it recurs: compiles behind this request
    assert built == [1000, 10] and compiler.counts["background"] == 1
    assert run(compiler, 10) == 10
    clock.now += 3 * 3600  # a use hours ago is no recurrence
    assert run(compiler, 20) == 1000
    clock.now += 3 * 3600
    assert run(compiler, 20) == 1000 and built == [1000, 10]
    assert compiler.counts["request_path"] == 0  # no request waited for a compile


def test_a_bound_full_of_one_offs_does_not_block_a_recurring_shape():
    compiler, _, clock = background_compiler(max_traffic=2)
    for tokens in (1001, 1002):  # one-offs nothing covers: compiled on the request path
        compiler.resolve("items", Width(tokens))
    clock.now += 1800  # half an hour later they are worth an eighth of a use
    assert run(compiler, 100) == 1000
    clock.now += 10
    assert run(compiler, 100) == 1000  # recurs, 10x padded: replaces a one-off at once
    assert run(compiler, 100) == 100
    assert compiler.counts["evicted_one_off"] == 1 and len(compiler) == 3


def test_a_recurring_shape_is_not_evicted_by_a_flood_of_one_offs():
    compiler, _, clock = background_compiler(max_traffic=2)
    for _ in range(4):  # a recurring shape, 10x padded on the warm-up envelope
        run(compiler, 100)
        clock.now += 30
    for tokens in range(200, 400, 5):  # forty one-offs, each seen once
        assert run(compiler, tokens) == 1000
        clock.now += 1
    assert ("items", Width(100)) in compiler.executables()
    assert compiler.counts["declined_one_off"] >= 40 and compiler.counts["evicted"] == 0


def test_at_the_bound_a_recurring_shape_needs_padding_and_more_worth_to_replace_one():
    compiler, built, clock = background_compiler(max_traffic=1)
    for _ in range(6):  # 500 tokens on 1000: kept, worth 6 uses x 500 saved
        run(compiler, 500)
        clock.now += 10
    assert run(compiler, 900) == 1000 and run(compiler, 900) == 1000  # 1.11x: small padding
    assert compiler.counts["declined_small_padding"] == 1
    assert run(compiler, 400) == 500 and run(compiler, 400) == 500  # 1.25x, worth 200 a use
    assert compiler.counts["declined_low_value"] == 1
    assert len(compiler) == 2 and built == [1000, 500]


def test_the_bound_holds_whatever_traffic_does():
    compiler, _, clock = background_compiler(max_traffic=3)
    for round_ in range(5):
        for tokens in (10, 20, 30, 40, 50):
            run(compiler, tokens + round_)
            run(compiler, tokens + round_)
            clock.now += 5
        assert len(compiler) <= 1 + 3
    assert compiler.counts["request_path"] == 0


def test_a_restart_replays_by_value_with_the_recorded_history(tmp_path):
    record = tmp_path / "signatures.json"
    clock = Clock()
    first, _, _ = background_compiler(max_traffic=3, record=record, clock=clock)
    for tokens, uses in ((100, 2), (200, 8), (300, 3)):
        for _ in range(uses):
            run(first, tokens)
            clock.now += 1
    first._persist()
    clock.now += 60
    second, _, _ = background_compiler(max_traffic=3, record=record, clock=clock)
    recorded = [dims.tokens for kind, dims in second.recorded()]
    # By worth: 300 saves 700 a use over the envelope (3 uses); 200 saves 100 over 300 (8
    # uses); 100 saves 100 over 200 (2 uses).
    assert recorded[:3] == [300, 200, 100]
    for kind, dims in second.recorded()[:2]:  # a replica keeping two replays the best two
        second.ensure(kind, dims, "warmup", keep=False)
    history = second._traffic[("items", Width(200))]
    assert history.last < clock.now - 59 and 7.9 < history.uses < 8.0  # not "used now"


def test_a_held_compile_is_not_scheduled_again_before_it_is_published():
    built = []

    def build(kind, dims):
        built.append(dims.tokens)
        return f"{kind}{dims.tokens}"

    compiler = StepCompiler(build, {"items": Width}, gated=True, clock=Clock())
    compiler.ensure("items", Width(1000), "warmup")
    for _ in range(4):  # recurs, compiles once, then stays held until the leader publishes
        assert compiler.resolve("items", Width(10)) == Width(1000)
        assert compiler.wait_idle(30)
    assert compiler.held() == [("items", Width(10))] and compiler.pending == 0
    compiler.publish(compiler.held())
    assert compiler.resolve("items", Width(10)) == Width(10) and built == [1000, 10]


def test_a_background_compile_runs_niced_and_leaves_the_caller_as_it_was():
    niceness = []

    def build(kind, dims):
        niceness.append(thread_niceness(threading.get_native_id()))
        return f"{kind}{dims.tokens}"

    compiler = StepCompiler(build, {"items": Width}, clock=Clock())
    compiler.ensure("items", Width(1000), "warmup")
    compiler.compile_later("items", Width(10))
    assert compiler.wait_idle(30) and compiler.counts["background"] == 1
    caller = thread_niceness(threading.get_native_id())
    assert niceness == [caller, max(BACKGROUND_NICENESS, caller)]
