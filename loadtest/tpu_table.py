"""The TPU projection table of docs/tpu.md: ``planning.tpu_check`` for every model x topology
(one process each: libtpu's environment is set before jax is imported): whether the plan
fits, memory per chip, and the roofline-projected items/s at RFC-008's workload.

    python -m loadtest run tpu_table [--models A,B] [--topologies v6e:2x2,...] [--signatures S]
        [--quantizations none,int8] [--mesh D,M] [--zip] [--workloads single,batched,ranking]

``--signatures``: one compiled signature per step kind (``smallest``, minutes) or the most
expensive ones (``largest``: the memory peak). Any ``--quantizations`` but ``none`` alone,
or a ``--mesh``, makes the quantized projection (int8's s8 x s8 dots at the chip's int8 peak,
``planning.tpu_projection.int8_share``) of docs/tpu.md and docs/quantization.md, keyed by
its mesh (``quantized_keys``). ``--zip``: the i-th model on the i-th topology only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtest.harness import ROOT, Option, Result, Run, Workload, col, table

MODELS = ("Qwen3-0.6B", "Llama-3.2-1B", "Qwen3-8B", "Llama-3.1-8B", "Llama-3.1-70B")
TOPOLOGIES = ("v6e:2x2", "v6e:4x4", "v5e:2x2", "v5e:4x4")
GIB = 1024**3
QUANT_DOC = "docs/quantization.md"


def run_check(o: argparse.Namespace, model: str, topology: str, form: str) -> dict[str, Any]:
    """``planning.tpu_check``'s plan of ``model`` on ``topology`` in ``form``, as JSON."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.json"
        command = [sys.executable, "-m", "planning.tpu_check", "--topology", topology,
                   "--model", model, "--signatures", o.signatures, "--json", str(out),
                   "--quantization", form, *(["--mesh", o.mesh] if o.mesh else []),
                   *(["--workloads", o.workloads] if o.workloads else [])]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"{topology} {model}: {done.stderr[-2000:]}")
        return json.loads(out.read_text()) | {"quantization": form}


def table_row(plan: dict[str, Any]) -> tuple:
    steps = plan["steps"]
    peak = max((s["step_bytes"] for s in steps), default=0)
    need = plan["param_bytes"] + plan["cache_bytes"] + peak
    rfc = {row["batch"]: row for row in plan["projection"] if row["shape"][1] == 10}
    rates = " / ".join(
        f"{rfc[b]['items_per_s']:,.0f} ({rfc[b]['items_per_s_cached_query']:,.0f})"
        for b in sorted(rfc)
    )
    ranking = [row for row in plan["projection"] if row["shape"][1] == 1000]
    return (
        plan["model"], plan.get("quantization", "none"), plan["topology"], str(list(plan["mesh"])),
        ", ".join(plan["crossing"]) or None, "yes" if plan["fits"] else "**no**",
        plan["param_bytes"] / GIB, f"{need / GIB:.2f} of {plan['hbm_bytes'] / GIB:.0f}",
        rates or None, ranking[0]["latency_s"] * 1e3 if ranking else None,
    )  # fmt: skip


COLUMNS = (
    col("model", left=True), col("quantization", left=True), col("topology", left=True),
    col("mesh [data, model]", left=True),
    col("axis across hosts", left=True), col("fits", left=True),
    col("parameters GiB/chip", ".2f"), col("needed GiB/chip of HBM"),
    col("projected items/s, 1 / 16 requests per step (query cached)"),
    col("projected ms, one request of 1000 items", ".2f"),
)  # fmt: skip


def pairs(o: argparse.Namespace) -> list[tuple[str, str]]:
    """(model, topology) of each check: every model on every topology, or with ``--zip``
    the i-th model on the i-th topology."""
    models, topologies = o.models.split(","), o.topologies.split(",")
    if o.zip:
        return list(zip(models, topologies, strict=True))
    return [(model, topology) for model in models for topology in topologies]


def quantized_keys(mesh: str) -> tuple[tuple[str, str], ...]:
    """The result keys (and their docs) of a quantized table on ``mesh`` (``--mesh``)."""
    suffix = "" if mesh == "1,1" else f"-{mesh.replace(',', 'x')}" if mesh else "-shipped"
    return (f"tpu-table-quant{suffix}", "docs/tpu.md"), (f"quant-tpu{suffix}", QUANT_DOC)


def quantized_where(mesh: str) -> str:
    """Where a quantized table's replicas lie, for its title: nothing for one chip."""
    if mesh == "1,1":
        return ""
    if not mesh:  # each slice's shipped layout: [hosts, chips per host], a model axis inside a host
        return " on the model axis"
    data, model = mesh.split(",")
    return f" on mesh [{data}, {model}]" + (" (a model axis)" if model != "1" else "")


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    rows = []
    for model, topology in pairs(o):
        for form in o.quantizations.split(","):
            rows.append(table_row(run_check(o, model, topology, form)))
            run.say(str(rows[-1]))
    notes = (
        f"compiled signatures: {o.signatures} per step kind of the shipped warm-up; one "
        "`planning.tpu_check` process per row (libtpu's environment is set before jax loads)",
    )
    tables = [table(COLUMNS, rows)]
    if o.quantizations == "none" and not o.mesh:
        return [run.result("Projection table", tables, key="tpu-table", doc="docs/tpu.md",
                           notes=notes)]  # fmt: skip
    notes += (QUANTIZED_NOTE,)
    title = f"Quantized projection table{quantized_where(o.mesh)} (from compiled executables)"
    return [
        run.result(title, tables, key=key, doc=doc, notes=notes)
        for key, doc in quantized_keys(o.mesh)
    ]


QUANTIZED_NOTE = (
    "a projection from compiled executables (deviceless), not a measurement: int8 W8A8's "
    "projections compile to s8 x s8 -> s32 convolutions (checked in the TPU HLO) and their "
    "FLOPs run at the chip's int8 peak (v6e 1836 TOP/s, twice bf16), the rest at bf16's"
)


WORKLOAD = Workload(
    options=(
        Option("--models", ",".join(MODELS)), Option("--topologies", ",".join(TOPOLOGIES)),
        Option("--signatures", "smallest", choices=("smallest", "largest")),
        Option("--quantizations", "none"), Option("--mesh", ""),
        Option("--zip", False), Option("--workloads", ""),
    ),
    measure=measure,
)  # fmt: skip
