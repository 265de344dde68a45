"""One chip's share of a compiled step, read from the executable XLA built for it.

``cost_analysis()`` of a partitioned executable is per device: FLOPs, the Pallas kernels'
own cost estimates included. HBM bytes are the serving executable's own memory analysis:
its arguments (parameters, inputs), outputs and temporaries, each moved at least once (XLA's
"bytes accessed" was tried and dropped: it swung 4x between compiles of the same step at
2 and 3 layers, with layout decisions that have nothing to do with a layer). Collectives
come from the compiled HLO:
each all-reduce, all-gather, reduce-scatter, all-to-all or collective-permute, with the
bytes one chip sends for it in a ring over its replica group. XLA counts the body of a loop
once, and every layer runs in one scanned body, so the served step counts the embedding, the
LM head and one layer. A second compile of the same step with no layers (the same model,
parameters and sharding, an empty layer stack: no loop) counts the rest alone; the
difference is one layer, and the whole step is ``bare + layers * (served - bare)``. Earlier
versions compiled the step again with two layers a scan iteration (their difference one
layer): the same FLOPs within 0.1% and the same collective bytes for Qwen3-0.6B on v6e:2x2
(docs/tpu.md), at 85 CPU-s a compile where the bare step takes 5.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from cluster.tpu_topology import ChipSpec

# `%name = TYPE op(` or `op-start(`: the result type is everything between `=` and the op.
_COLLECTIVE = re.compile(
    r"=\s*(?P<type>.+?)\s+(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"collective-permute)(?:-start)?\((?P<rest>.*)$"
)
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4}
_ITEMSIZE |= {"u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_ARRAY = re.compile(rf"\b(?P<dtype>{'|'.join(_ITEMSIZE)})\[(?P<dims>[\d,]*)\]")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{(?P<first>[\d,]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(?P<shape>[\d,]+)\]<=")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<over>[^}]*)\}")
_AXIS = re.compile(r"'(?P<name>[^']+)'=(?P<size>\d+)")


@dataclass(frozen=True)
class ChipCost:
    """Per chip, per step: FLOPs, HBM bytes accessed, bytes sent over ICI."""

    flops: float
    hbm_bytes: float
    ici_bytes: float
    int8_flops: float = 0.0  # of ``flops``: the s8 x s8 -> s32 dots (quantization: int8)

    def seconds(self, chip: ChipSpec) -> float:
        """Roofline plus collectives: ``max(FLOPs / peak, bytes / HBM bandwidth)`` and the
        collectives' bytes over the chip's ICI bandwidth, not overlapped (a bound, not a
        measurement). The int8 dots' FLOPs run at the chip's int8 peak."""
        matmul = (self.flops - self.int8_flops) / chip.peak_flops
        matmul += self.int8_flops / chip.int8_peak
        compute = max(matmul, self.hbm_bytes / chip.hbm_bandwidth)
        return compute + self.ici_bytes / chip.ici_bandwidth

    def collective_seconds(self, chip: ChipSpec) -> float:
        return self.ici_bytes / chip.ici_bandwidth


def array_bytes(text: str) -> list[int]:
    """Bytes of each array type in an HLO type string such as ``(f32[4,8]{1,0}, s32[])``."""
    sizes = []
    for match in _ARRAY.finditer(text):
        count = 1
        for dim in filter(None, match["dims"].split(",")):
            count *= int(dim)
        sizes.append(count * _ITEMSIZE[match["dtype"]])
    return sizes


def group_size(rest: str) -> int:
    """Devices in the op's replica group: ``{{0,1},{2,3}}``, the iota form ``[2,2]<=[4]``,
    or the mesh form ``mesh['axis_0'=4,'axis_1'=1] {'axis_0'}`` (the product of the named
    axes)."""
    by_mesh = _GROUPS_MESH.search(rest)
    if by_mesh:
        sizes = {m["name"]: int(m["size"]) for m in _AXIS.finditer(by_mesh["axes"])}
        over = re.findall(r"'([^']+)'", by_mesh["over"])
        return max(1, math.prod(sizes.get(name, 1) for name in over))
    listed = _GROUPS_LIST.search(rest)
    if listed:
        return max(1, len(listed["first"].split(",")))
    iota = _GROUPS_IOTA.search(rest)
    if iota:
        return int(iota["shape"].split(",")[-1])
    return 2  # collective-permute names pairs, not groups


def sent_bytes(op: str, result: list[int], n: int) -> float:
    """Bytes one chip sends for ``op`` in a ring of ``n``: all-reduce 2 (n - 1) / n of the
    array; all-gather (n - 1) / n of its output; reduce-scatter (n - 1) outputs; all-to-all
    (n - 1) / n; collective-permute the whole array. An async ``-start`` returns its operand
    beside its output: the largest array is the output."""
    if op == "all-reduce":
        return 2 * (n - 1) / n * sum(result)
    largest = max(result, default=0)
    if op == "all-gather":
        return (n - 1) / n * largest
    if op == "reduce-scatter":
        return (n - 1) * largest
    if op == "all-to-all":
        return (n - 1) / n * sum(result)
    return float(largest)


def ici_bytes(hlo: str) -> float:
    """Bytes one chip sends over ICI for every collective in the compiled HLO text."""
    total = 0.0
    for line in hlo.splitlines():
        match = _COLLECTIVE.search(line)
        if match:
            total += sent_bytes(match["op"], array_bytes(match["type"]), group_size(match["rest"]))
    return total


def executable_cost(compiled: Any) -> ChipCost:
    """Per-chip cost of one compiled executable, loop bodies counted once."""
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0))
    return ChipCost(flops, moved_bytes(compiled), ici_bytes(compiled.as_text()))


def moved_bytes(compiled: Any) -> float:
    """Arguments, outputs and temporaries of an executable, per chip (aliased ones once)."""
    memory = compiled.memory_analysis()
    return float(
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )


def every_layer(served: ChipCost, bare: ChipCost, layers: int, int8_share: float = 0.0) -> ChipCost:
    """The step of ``layers`` layers from its served compile (the loop body, one layer,
    counted once) and its compile with no layers: FLOPs and collectives ``bare + layers *
    (served - bare)``; HBM bytes the served executable's own (its arguments hold every
    layer's parameters already). ``int8_share``: the part of a layer's FLOPs its int8
    projections are (``quantization: int8``; the heads outside the layers stay bf16)."""

    def scale(with_one: float, without: float) -> float:
        return without + layers * max(with_one - without, 0.0)

    flops = scale(served.flops, bare.flops)
    int8 = layers * max(served.flops - bare.flops, 0.0) * int8_share
    return ChipCost(flops, served.hbm_bytes, scale(served.ici_bytes, bare.ici_bytes), int8)
