"""Benchmark: RFC-008's workload on a Gemma-3-1B-shaped model with random weights.

For N items behind a 300-token query (10-token items) it times the engine's own single-item
path and its shared-prefix multi-item layout (the shipped serve_config.yaml's replica
settings) and transformers' ``Gemma3ForCausalLM`` batched single-item scoring, on the same
CPU and the same weights (a random transformers model saved with save_pretrained and loaded
by scorejax), side by side in one run.

    python -m loadtest run families [--model Gemma-3-1B] [--items 10,100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cluster.mesh import build_mesh
from loadtest.bench_common import hf_scorer, make_work, shipped_settings, timed_steady
from loadtest.harness import Option, Result, Run, Workload, col, counts, ratio, table, timed
from replicas.checkpoints.loading import load_model
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.catalog import HF_CONFIGS, hf_config


def random_checkpoint(name: str, directory: Path) -> Any:
    """A random-weight transformers model of catalog ``name``, saved into ``directory``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(HF_CONFIGS[name]), dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    return model.eval()


def run_items(args: argparse.Namespace, directory: Path, run: Run) -> list[dict]:
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
        if args.hf:
            score = hf_scorer(work, hf_model)
            row["transformers"] = timed(score, 1)
            row["hf_diff"] = float(np.abs(score() - scores["single"]).max())
        row["parity"] = float(np.abs(scores["shared_prefix"] - scores["single"]).max())
        run.say(f"{n} items: {row_cells(row)}")
        rows.append(row)
    return rows


COLUMNS = (
    col("items", "d"), col("own single-item s", ".2f"), col("multi-item s", ".2f"),
    col("transformers s", ".2f"), col("multi vs own single", ".1f", "x"),
    col("multi vs transformers", ".1f", "x"), col("max abs diff multi vs single", ".1e"),
    col("max abs diff vs transformers", ".1e"),
)  # fmt: skip


def row_cells(r: dict) -> tuple:
    hf = r.get("transformers")
    return (r["items"], r["single"], r["shared_prefix"], hf, r["single"] / r["shared_prefix"],
            ratio(hf, r["shared_prefix"]), r["parity"], r.get("hf_diff"))  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.items = counts(o.items)
    with tempfile.TemporaryDirectory(prefix="bench-families-") as directory:
        rows = run_items(o, Path(directory), run)
    notes = (
        f"{o.model}'s shape with random weights, float32, the replica settings of "
        "`serve_config.yaml` (query cache off); RFC-008's workload; single-item: the engine's "
        f"own per-item path; transformers: `AutoModelForCausalLM` of {o.model}, fp32, batched "
        "rows, `logits_to_keep=1`, same weights; single-item and transformers: one timed call; "
        f"multi-item: the median of {o.repeats}",
        f"jax {jax.__version__} on {jax.devices()[0].platform}",
    )
    tables = [table(COLUMNS, [row_cells(r) for r in rows])]
    return [run.result(f"{o.model} (random weights), engine", tables, key=f"families-{o.model}",
                       notes=notes)]  # fmt: skip


WORKLOAD = Workload(
    options=(
        Option("--model", "Gemma-3-1B", choices=tuple(sorted(HF_CONFIGS))),
        Option("--items", "10"), Option("--query-tokens", 300), Option("--item-tokens", 10),
        Option("--repeats", 3), Option("--no-hf", True, "skip the transformers baseline"),
    ),
    measure=measure,
)  # fmt: skip
