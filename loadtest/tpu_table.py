"""``python -m loadtest.tpu_table``: the TPU projection table of docs/tpu.md.

Runs ``planning.tpu_check`` (one process each: libtpu's environment is set before jax is
imported) for every model x topology and writes the "Projection table" section of
docs/tpu.md: whether the plan fits, memory per chip, and the roofline-projected items/s at
RFC-008's workload. ``--signatures smallest`` compiles one signature per step kind (minutes);
``largest`` the most expensive ones (the memory peak; much slower).

    python -m loadtest.tpu_table [--models A,B] [--topologies v6e:2x2,...] [--signatures S]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.bench_common import write_section

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("Qwen3-0.6B", "Llama-3.2-1B", "Qwen3-8B", "Llama-3.1-8B", "Llama-3.1-70B")
TOPOLOGIES = ("v6e:2x2", "v6e:4x4", "v5e:2x2", "v5e:4x4")
SECTION = "## Projection table"
GIB = 1024**3


def run_check(topology: str, model: str, signatures: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.json"
        command = [sys.executable, "-m", "planning.tpu_check", "--topology", topology]
        command += ["--model", model, "--signatures", signatures, "--json", str(out)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"{topology} {model}: {done.stderr[-2000:]}")
        return json.loads(out.read_text())


def table_row(plan: dict[str, Any]) -> str:
    steps = plan["steps"]
    peak = max((s["step_bytes"] for s in steps), default=0)
    need = plan["param_bytes"] + plan["cache_bytes"] + peak
    rfc = {row["batch"]: row for row in plan["projection"] if row["shape"][1] == 10}
    rates = " / ".join(
        f"{rfc[b]['items_per_s']:,.0f} ({rfc[b]['items_per_s_cached_query']:,.0f})"
        for b in sorted(rfc)
    )
    ranking = [row for row in plan["projection"] if row["shape"][1] == 1000]
    latency = f"{ranking[0]['latency_s'] * 1e3:.2f}" if ranking else "-"
    return (
        f"| {plan['model']} | {plan['topology']} | {list(plan['mesh'])} | "
        f"{', '.join(plan['crossing']) or '-'} | {'yes' if plan['fits'] else '**no**'} | "
        f"{plan['param_bytes'] / GIB:.2f} | {need / GIB:.2f} of {plan['hbm_bytes'] / GIB:.0f} | "
        f"{rates or '-'} | {latency} |"
    )


HEADER = (
    "| model | topology | mesh [data, model] | axis across hosts | fits | parameters GiB/chip "
    "| needed GiB/chip of HBM | projected items/s, 1 / 16 requests per step (query cached) "
    "| projected ms, one request of 1000 items |\n"
    "|---|---|---|---|---|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--signatures", default="smallest", choices=("smallest", "largest"))
    parser.add_argument("--output", default=str(ROOT / "docs" / "tpu.md"))
    args = parser.parse_args(argv)
    rows, start = [], time.perf_counter()
    for model in args.models.split(","):
        for topology in args.topologies.split(","):
            rows.append(table_row(run_check(topology, model, args.signatures)))
            print(rows[-1], flush=True)
    command = f"python -m loadtest.tpu_table --signatures {args.signatures}"
    body = (
        f"`{command}` ({time.perf_counter() - start:.0f} s on this 2-core machine; compiled "
        f"signatures: {args.signatures} per step kind of the shipped warm-up).\n\n"
        + HEADER
        + "\n"
        + "\n".join(rows)
        + "\n"
    )
    write_section(Path(args.output), SECTION, body, title="# TPU")
    print(f"wrote {SECTION!r} of {args.output}")


if __name__ == "__main__":
    main()
