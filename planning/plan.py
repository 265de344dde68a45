"""``python -m planning.plan``: which layout a TPU slice should serve a model with.

    python -m planning.plan --topology v6e:4x4 --model Qwen3-0.6B --json plan.json

Enumerates the layouts of the slice (``planning.layouts``: chips per replica, hosts per
replica, ``[data, model]`` mesh, replicas per slice), and for each one, deviceless with
compile-only libtpu: refuses it when the parameters and the query cache do not fit a chip's
HBM, compiles the most expensive warm-up signature of each step kind and refuses it when
parameters + query cache + that step do not fit (``--no-fit`` takes it as fitting:
re-projecting a layout known to fit, as tests/engine/test_manifests.py re-projects a
manifest's), then projects the workload (RFC-008's 300-token query with 10 items of 10
tokens unless ``--workload``) at the largest batch bucket from the compiled steps,
collectives included (``planning.tpu_projection``). Prints
the layouts ranked by projected items/s per slice (refusals last, with their reason), and
checks the winner with every warm-up signature compiled. ``--emit`` writes a RayService
manifest for the winner (``--emit-serve``: a serve config), its header naming the command
and the projected figures. Projections are bounds from published chip figures, not
measurements. ``--quantization`` (else the config's ``quantization``) plans the quantized
model: its weights counted as placed (``int8``: int8 values and float32 scales, about half
of bfloat16's bytes), its steps compiled with the quantized projections; the emitted
manifest carries the form. Exits 1 when no layout fits, 2 on a bad option.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from cluster.tpu_topology import GIB, TopologyError, prepare_environment
from planning.layouts import Layout, parse_mesh
from planning.planner import Planner, layout_row
from planning.tpu_check import add_lora_arguments, add_quantization_argument

RFC_008 = (300, 10, 10)


PER_SLICE = {
    "items_per_s_per_slice": "items_per_s_per_replica",
    "items_per_s_per_slice_cached_query": "items_per_s_per_replica_cached_query",
}


class RowCache:
    """Rows of layouts already planned (``--cache DIR``), keyed by everything a replica's
    row depends on: chip, model config, mesh, hosts, serve args, workload, signatures. A
    replica of 4 chips plans the same on a v6e:2x2 slice as on a v6e:4x4 slice."""

    def __init__(self, folder: str | None) -> None:
        self._folder = Path(folder) if folder else None
        if self._folder:
            self._folder.mkdir(parents=True, exist_ok=True)

    def key(self, planner: Planner, layout: Layout, signatures: str) -> str:
        parts = [planner.chip, repr(planner.config), layout.mesh, layout.hosts_per_replica,
                 planner.args, planner.workload, signatures, planner.lora]  # fmt: skip
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]

    def get(self, key: str, layout: Layout) -> dict[str, Any] | None:
        path = self._folder / f"{key}.json" if self._folder else None
        if path is None or not path.exists():
            return None
        row = json.loads(path.read_text()) | layout_row(layout)
        for slice_key, replica_key in PER_SLICE.items():
            if replica_key in row:
                row[slice_key] = round(row[replica_key] * layout.replicas_per_slice, 1)
        return row | {"cached": True}

    def put(self, key: str, row: dict[str, Any]) -> None:
        if self._folder:
            (self._folder / f"{key}.json").write_text(json.dumps(row))


TIE = 0.01  # projected items/s this close are a tie, broken by the lower step latency


def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fitting layouts by items/s per slice, refusals last. Layouts within ``TIE`` of the
    best of their group rank by step latency: a projection is not that precise, and the
    faster step is what a request sees."""
    fitting = sorted((r for r in rows if r["fits"]), key=lambda r: -r["items_per_s_per_slice"])
    groups: list[list[dict[str, Any]]] = []
    for row in fitting:
        if (
            groups
            and row["items_per_s_per_slice"] >= (1 - TIE) * groups[-1][0]["items_per_s_per_slice"]
        ):
            groups[-1].append(row)
        else:
            groups.append([row])
    order = [r for group in groups for r in sorted(group, key=lambda r: r["step_latency_s"])]
    return order + [row for row in rows if not row["fits"]]


def format_table(rows: list[dict[str, Any]], slices: int) -> str:
    lines = [
        "| rank | chips/replica | hosts/replica | mesh [data, model] | replicas/slice | "
        "HBM need/chip | items/s per slice | items/s, query cached | step latency | note |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for rank, row in enumerate(rows, start=1):
        need = row.get("need_bytes_per_chip")
        common = (
            f"| {rank if row['fits'] else '-'} | {row['chips_per_replica']} | "
            f"{row['hosts_per_replica']} | {row['mesh']} | {row['replicas_per_slice']} | "
            f"{'-' if need is None else f'{need / GIB:.2f} GiB'} |"
        )
        if row["fits"]:
            lines.append(
                f"{common} {row['items_per_s_per_slice']:,.0f} | "
                f"{row['items_per_s_per_slice_cached_query']:,.0f} | "
                f"{row['step_latency_s'] * 1e3:.2f} ms | |"
            )
        else:
            lines.append(f"{common} - | - | - | refused: {row['reason']} |")
    if slices > 1:
        lines.append(f"\n{slices} slices: multiply items/s per slice by {slices}.")
    return "\n".join(lines)


def parse_workload(text: str) -> tuple[int, int, int]:
    try:
        query, items, item_tokens = (int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected QUERY,ITEMS,ITEM_TOKENS, got {text!r}"
        ) from None
    if min(query, items, item_tokens) < 1:
        raise argparse.ArgumentTypeError(f"every part must be >= 1, got {text!r}")
    return query, items, item_tokens


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True, help="the slice: v6e:4x4, v6e:2x2, v5e:2x2")
    parser.add_argument("--model", required=True, help="catalog name or config.json")
    parser.add_argument(
        "--workload", type=parse_workload, default=RFC_008, help="QUERY,ITEMS,ITEM_TOKENS"
    )
    parser.add_argument("--slices", type=int, default=1, help="slices the deployment holds")
    parser.add_argument(
        "--config", help="serve config or manifest (default: serve_config.yaml + TPU args)"
    )
    parser.add_argument("--mesh", type=parse_mesh, help="DATA,MODEL: only this layout")
    parser.add_argument("--verify-winner", action=argparse.BooleanOptionalAction, default=True,
                        help="compile every warm-up signature of the winner (slow)")  # fmt: skip
    parser.add_argument("--fit", action=argparse.BooleanOptionalAction, default=True,
                        help="compile each step kind's largest warm-up signature against HBM "
                        "(--no-fit: take the layouts as fitting, as when re-projecting a "
                        "manifest's own layout)")  # fmt: skip
    parser.add_argument("--libtpu", help="path of libtpu.so (default: found)")
    parser.add_argument("--cache", help="folder of rows already planned, reused and added to")
    parser.add_argument("--json", help="write the ranked rows here")
    parser.add_argument("--emit", help="write a RayService manifest for the winner here")
    parser.add_argument("--emit-serve", help="write a serve config for the winner here")
    parser.add_argument("--served-model", help="the model arg written (default /models/MODEL)")
    add_quantization_argument(parser)
    add_lora_arguments(parser)
    options = parser.parse_args(argv)
    if options.slices < 1:
        parser.error("--slices: must be >= 1")
    return options


def plan(planner: Planner) -> list[dict[str, Any]]:
    options, cache = planner.options, RowCache(planner.options.cache)
    layouts = planner.layouts()
    print(
        f"{options.model} on {options.topology}: {len(planner.devices)} {planner.chip.name} chips "
        f"on {planner.hosts} host(s); {len(layouts)} layouts; workload {list(options.workload)} "
        f"(query, items, item tokens) at the largest batch bucket",
        flush=True,
    )

    def planned(layout: Layout, verify: dict[str, Any] | None = None) -> dict[str, Any]:
        key = cache.key(planner, layout, "all" if verify else "largest" if options.fit else "none")
        row = cache.get(key, layout)
        if row is None:
            row = planner.verify(layout, verify) if verify else planner.evaluate(layout)
            cache.put(key, row)
        return row

    rows = []
    for layout in layouts:
        rows.append(planned(layout))
        print(f"  {layout.name}: {summary(rows[-1])}", flush=True)
    rows = ranked(rows)
    while options.verify_winner and rows and rows[0]["fits"] and not rows[0].get("verified"):
        winner = next(layout for layout in layouts if layout_row(layout).items() <= rows[0].items())
        rows[0] = planned(winner, rows[0]) | {"verified": True}
        print(f"  winner, every warm-up signature compiled: {summary(rows[0])}", flush=True)
        rows = ranked(rows)  # a refused winner makes way for the next
    return rows


def summary(row: dict[str, Any]) -> str:
    spent = compile_summary(row)
    if not row["fits"]:
        return f"refused: {row['reason']}{spent}"
    return (
        f"{row['items_per_s_per_slice']:,.0f} items/s per slice, step "
        f"{row['step_latency_s'] * 1e3:.2f} ms, {row['need_bytes_per_chip'] / GIB:.2f} GiB per chip"
        f"{spent}"
    )


def compile_summary(row: dict[str, Any]) -> str:
    """Where the layout's planning time went (``planning.compile_times``), or nothing for a
    row refused before compiling or read from ``--cache``."""
    if row.get("cached"):
        return " (from --cache)"
    if "plan_s" not in row:
        return ""
    cpu = row.get("compile_cpu_s", {})
    spent = ", ".join(
        f"{purpose} {s:.0f} s ({cpu.get(purpose, 0):.0f} s CPU)"
        for purpose, s in row.get("compile_s", {}).items()
    )
    return f"; planned in {row['plan_s']:.0f} s wall ({spent or 'no compile'})"


def command_line(argv: list[str]) -> str:
    """The command as a header records it: without where this run wrote its files."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--cache", "--json"):
            skip = True
        elif not arg.startswith(("--cache=", "--json=")):
            kept.append(arg)
    return " ".join(["python -m planning.plan", *kept])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options = parse_args(argv)
    try:
        prepare_environment(options.topology, options.libtpu)
        planner = Planner(options)
        rows = plan(planner)
    except (TopologyError, ValueError) as error:
        print(f"plan: {error}", file=sys.stderr)
        return 2
    print(format_table(rows, options.slices))
    meta = {
        "topology": options.topology,
        "model": options.model,
        "chip": planner.chip.name,
        "chips": len(planner.devices),
        "hosts": planner.hosts,
        "slices": options.slices,
        "workload": list(options.workload),
        "command": command_line(argv),
    }
    if options.json:
        Path(options.json).write_text(json.dumps(meta | {"rows": rows}, indent=1))
    if not rows or not rows[0]["fits"]:
        print("plan: no layout fits this slice", file=sys.stderr)
        return 1
    if options.emit or options.emit_serve:
        from planning.emit import write_outputs

        write_outputs(options, meta, rows[0], planner.args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
