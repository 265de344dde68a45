"""Benchmark: RFC-008's workload on a Gemma-3-1B-shaped model with random weights.

For N items behind a 300-token query (10-token items) it times the engine's own single-item
path and its shared-prefix multi-item layout (the shipped serve_config.yaml's replica
settings) and transformers' ``Gemma3ForCausalLM`` batched single-item scoring, on the same
CPU and the same weights (a random transformers model saved with save_pretrained and loaded
by scorejax), side by side in one run, and writes its section of docs/benchmarks.md.

    python -m loadtest.bench_families [--model Gemma-3-1B] [--items 10,100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cluster.mesh import build_mesh
from loadtest.bench_common import hf_scorer, machine_description, timed, write_section
from loadtest.bench_engine import make_work, shipped_settings, timed_steady
from replicas.checkpoints.loading import load_model
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.catalog import HF_CONFIGS, hf_config

SECTION = "## Gemma 3 (1B shape, random weights), engine"


def random_checkpoint(name: str, directory: Path) -> Any:
    """A random-weight transformers model of catalog ``name``, saved into ``directory``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(HF_CONFIGS[name]), dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    return model.eval()


def run(args: argparse.Namespace, directory: Path) -> list[dict]:
    hf_model = random_checkpoint(args.model, directory)
    shipped = shipped_settings().replace(model=str(directory), max_multi_item_seq_len=8192)
    mesh = build_mesh(shipped.placement.mesh_shape)
    loaded = load_model(directory, mesh, "float32")
    engines = {
        "single": ScoringEngine(
            loaded.model, loaded.params, mesh, shipped.replace(multi_item_scoring_delimiter=None),
            args.model,
        ),
        "shared_prefix": ScoringEngine(loaded.model, loaded.params, mesh, shipped, args.model),
    }  # fmt: skip
    rows = []
    for n in args.items:
        work = make_work(n, args.query_tokens, args.item_tokens)
        row: dict[str, Any] = {"items": n}
        scores = {}
        for name, engine in engines.items():
            reps = 1 if name == "single" else args.repeats
            row[name] = timed_steady(engine, work, reps)
            scores[name] = engine.score_batch([work])[0]
        if not args.no_hf:
            score = hf_scorer(work, hf_model)
            row["transformers"] = timed(score, 1)
            row["hf_diff"] = float(np.abs(score() - scores["single"]).max())
        row["parity"] = float(np.abs(scores["shared_prefix"] - scores["single"]).max())
        print(format_row(row), flush=True)
        rows.append(row)
    return rows


HEADER = (
    "| items | own single-item s | multi-item s | transformers s | multi vs own single "
    "| multi vs transformers | max abs diff multi vs single | max abs diff vs transformers |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def format_row(r: dict) -> str:
    hf = r.get("transformers")
    cells = [
        str(r["items"]),
        f"{r['single']:.2f}",
        f"{r['shared_prefix']:.2f}",
        "-" if hf is None else f"{hf:.2f}",
        f"{r['single'] / r['shared_prefix']:.1f}x",
        "-" if hf is None else f"{hf / r['shared_prefix']:.1f}x",
        f"{r['parity']:.1e}",
        "-" if hf is None else f"{r['hf_diff']:.1e}",
    ]
    return "| " + " | ".join(cells) + " |"


def write_report(rows: list[dict], args: argparse.Namespace) -> None:
    lines = [
        f"`python -m loadtest.bench_families --items {','.join(map(str, args.items))}`: "
        f"{args.model}'s shape (262k vocabulary, windows of 512 on 5 of 6 layers) with random",
        "weights, float32, the replica settings of `serve_config.yaml` (query cache off);",
        "single-item: the engine's own per-item path; transformers: `Gemma3ForCausalLM`, fp32,",
        "batched rows, `logits_to_keep=1`, same weights. Single-item and transformers: one run;",
        f"multi-item: median of {args.repeats}.",
        "",
        f"- machine: {machine_description()}, jax {jax.__version__} on "
        f"{jax.devices()[0].platform}; load average {args.load_before:.1f} before the run, "
        f"{os.getloadavg()[0]:.1f} after (the ratios are side by side in one run)",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    write_section(Path(args.output), SECTION, "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Gemma-3-1B", choices=sorted(HF_CONFIGS))
    parser.add_argument("--items", type=lambda s: [int(n) for n in s.split(",")], default=[10])
    parser.add_argument("--query-tokens", type=int, default=300)
    parser.add_argument("--item-tokens", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    args.load_before = os.getloadavg()[0]
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-families-") as directory:
        rows = run(args, Path(directory))
    write_report(rows, args)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
