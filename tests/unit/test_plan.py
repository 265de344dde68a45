"""planning.plan: the layouts of a slice, their ranking, and refusals before compiling.

The planner's compiled projections are exercised by tests/engine/test_manifests.py, which re-runs it
for every shipped manifest's layout and compares the figures in the manifest's header; its
command-line refusals (a bad ``--mesh``, Llama-3.1-70B on a v6e:2x2), which load libtpu's
deviceless topology, by tests/engine/test_tpu_check.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planning.layouts import (
    Layout,
    enumerate_layouts,
    parse_mesh,
    replica_devices,
    replica_shape,
    replica_sizes,
)
from planning.plan import format_table, ranked


def test_replica_sizes_are_parts_of_a_host_or_whole_hosts() -> None:
    assert replica_sizes(16, 4) == [1, 2, 4, 8, 16]  # v6e:4x4, 4 hosts of 4 chips
    assert replica_sizes(4, 1) == [1, 2, 4]  # v6e:2x2, one host
    assert replica_sizes(32, 8) == [1, 2, 4, 8, 16, 32]
    assert replica_sizes(24, 6) == [1, 2, 4, 8, 12, 24]  # 2 and 3 of 6 hosts, not 4


def test_every_layout_uses_every_chip_of_the_slice() -> None:
    layouts = enumerate_layouts(16, 4)
    assert len(layouts) == 1 + 2 + 3 + 4 + 5  # a mesh per factorisation of each size
    for layout in layouts:
        assert layout.chips_per_replica * layout.replicas_per_slice == 16
        assert layout.mesh[0] * layout.mesh[1] == layout.chips_per_replica
        assert layout.hosts_per_replica == max(1, layout.chips_per_replica // 4)
    assert Layout(16, 4, (1, 16), 1) in layouts and Layout(1, 1, (1, 1), 16) in layouts
    assert Layout(8, 2, (2, 4), 2) in layouts


def test_a_replica_takes_whole_hosts_or_the_first_chips_of_one() -> None:
    devices = [SimpleNamespace(process_index=p, id=4 * p + c) for p in (1, 0) for c in range(4)]
    two = replica_devices(devices, Layout(2, 1, (1, 2), 4))
    assert [(d.process_index, d.id) for d in two] == [(0, 0), (0, 1)]
    group = replica_devices(devices, Layout(8, 2, (2, 4), 1))
    assert sorted({d.process_index for d in group}) == [0, 1] and len(group) == 8


def test_a_replica_compiles_on_a_topology_of_its_own_hosts() -> None:
    # A v6e:4x4 host holds device ids 0, 1, 4, 5; libtpu refuses a 4-device computation
    # over those, so a one-host replica compiles on a 2x2 topology (ids 0-3) instead.
    assert replica_shape("4x4", 8) == ["2x4", "4x2"]
    assert replica_shape("4x4", 4) == ["2x2", "1x4", "4x1"]
    assert replica_shape("2x2x2", 4) == ["1x2x2", "2x1x2", "2x2x1"]


def test_mesh_option_is_parsed_or_named_in_the_error() -> None:
    assert parse_mesh("1,16") == (1, 16)
    with pytest.raises(ValueError, match="--mesh"):
        parse_mesh("4x4")
    with pytest.raises(ValueError, match="--mesh"):
        parse_mesh("0,4")


def row(mesh: list[int], items: float | None, latency: float = 0.01) -> dict:
    fits = items is not None
    return {
        "chips_per_replica": mesh[0] * mesh[1],
        "hosts_per_replica": 1,
        "mesh": mesh,
        "replicas_per_slice": 4 // (mesh[0] * mesh[1]),
        "fits": fits,
        "reason": "" if fits else "parameters + query cache 40.0 GiB per chip > HBM",
        "items_per_s_per_slice": items,
        "items_per_s_per_slice_cached_query": None if items is None else 2 * items,
        "step_latency_s": latency,
        "need_bytes_per_chip": None,
    }


def test_ranked_by_items_per_second_near_ties_by_latency_refusals_last() -> None:
    rows = [row([1, 1], None), row([1, 2], 10.0, 0.02), row([1, 4], 30.0), row([2, 1], 10.0)]
    order = [r["mesh"] for r in ranked(rows)]
    assert order == [[1, 4], [2, 1], [1, 2], [1, 1]]
    # Within 1% of each other: the faster step first, even with slightly fewer items/s.
    near = [row([1, 1], 320_635.0, 0.00798), row([2, 1], 320_198.0, 0.0040), row([1, 2], 300.0)]
    assert [r["mesh"] for r in ranked(near)] == [[2, 1], [1, 1], [1, 2]]
    table = format_table(ranked(rows), slices=1)
    assert table.splitlines()[2].startswith("| 1 | 4 | 1 | [1, 4] | 1 |")
    assert "refused: parameters + query cache" in table.splitlines()[-1]


def test_the_compilers_hbm_refusal_is_a_refused_row_and_other_errors_propagate() -> None:
    from planning.planner import Planner

    message = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, temporaries (27.90G) exceed (15.75G)."
    planner = object.__new__(Planner)
    planner.chip = SimpleNamespace(hbm_bytes=16 * 2**30)
    planner.options = SimpleNamespace(fit=True)
    planner.engine = lambda layout: (None, None, 2**30, SimpleNamespace(query_cache_bytes=0))

    def fit_out_of_hbm(*_: object) -> None:
        raise RuntimeError(message)

    planner.fit = fit_out_of_hbm
    row = planner.evaluate(
        Layout(chips_per_replica=4, hosts_per_replica=1, mesh=(1, 4), replicas_per_slice=1)
    )
    assert row["fits"] is False
    assert row["reason"] == "the compiler ran out of HBM: " + message.removeprefix(
        "RESOURCE_EXHAUSTED: "
    )

    def fit_broken(*_: object) -> None:
        raise RuntimeError("INTERNAL: something else")

    planner.fit = fit_broken
    with pytest.raises(RuntimeError, match="INTERNAL"):
        planner.evaluate(
            Layout(chips_per_replica=4, hosts_per_replica=1, mesh=(1, 4), replicas_per_slice=1)
        )


class _Dims(tuple):
    def astuple(self) -> tuple[int, ...]:
        return tuple(self)


class _Engine:
    """``compile_keys`` as the engine's: an items step compiles its prefix step inside it."""

    def __init__(self, refuse: tuple[str, object] | None = None) -> None:
        self.compiled: dict[tuple[str, object], str] = {}
        self.refuse = refuse

    def executables(self) -> dict[tuple[str, object], str]:
        return dict(self.compiled)

    def compile_keys(self, keys: list[tuple[str, object]]) -> None:
        for kind, dims in keys:
            if (kind, dims) == self.refuse:
                raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
            if kind == "items":
                self.compiled[("prefix", _Dims((1, 32)))] = "nested"
            self.compiled[(kind, dims)] = "compiled"


def test_compile_times_record_each_new_compile_by_purpose_and_the_refused_one() -> None:
    from planning.compile_times import CompileTimes

    items, prefix = ("items", _Dims((1, 32, 8))), ("prefix", _Dims((1, 32)))
    times, engine = CompileTimes(echo=None), _Engine()
    times.compile(engine, [items, prefix], "fit")  # the prefix step came with the items step
    times.compile(engine, [items], "bytes")  # held already: nothing compiled, nothing recorded
    times.compile(_Engine(), [prefix], "cost 2 layers")
    assert [(e["purpose"], e["kind"], e["dims"], e["nested"]) for e in times.entries] == [
        ("fit", "items", [1, 32, 8], 1),
        ("cost 2 layers", "prefix", [1, 32], 0),
    ]
    assert list(times.totals()) == list(times.totals("cpu_seconds")) == ["fit", "cost 2 layers"]
    assert all(e["seconds"] >= 0 and e["cpu_seconds"] >= 0 for e in times.entries)
    with pytest.raises(RuntimeError, match="HBM"):
        times.compile(_Engine(refuse=prefix), [prefix], "fit")
    assert times.entries[-1]["kind"] == "prefix" and len(times.entries) == 3


def test_the_quantization_option_reaches_the_emitted_manifest() -> None:
    from planning.emit import documents
    from planning.plan import parse_args
    from planning.serve_args import base_args
    from planning.tpu_check import with_quantization

    options = parse_args(["--topology", "v6e:2x2", "--model", "Llama-3.1-70B",
                          "--quantization", "int8"])  # fmt: skip
    meta = {"topology": "v6e:2x2", "model": "Llama-3.1-70B", "slices": 1, "hosts": 1,
            "chips": 4, "workload": [300, 10, 10], "command": "plan"}  # fmt: skip
    row = {"chips_per_replica": 4, "hosts_per_replica": 1, "mesh": [1, 4],
           "replicas_per_slice": 1, "items_per_s_per_slice": 1.0, "step_latency_s": 0.1,
           "requests_per_step": 16}  # fmt: skip
    for args, form in (
        (base_args(None), "none"),
        (with_quantization(base_args(None), options), "int8"),
    ):
        serve, manifest = documents(meta, row, args)
        assert f"quantization: {form}\n" in serve and f"quantization: {form}\n" in manifest
