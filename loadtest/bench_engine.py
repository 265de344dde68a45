"""Multi-item vs single-item scoring on the real SmolLM2-135M-Instruct, engine only.

For N items behind a 300-token query (10-token items): the engine's single-item,
shared-prefix and packed-reference layouts with the replica settings of the shipped
serve_config.yaml, and transformers' batched single-item scoring, side by side in one run on
the same CPU and weights, timed in turn; this machine's float32 matmul peak and the padding.

    python -m loadtest run engine [--items 1,10,100] [--repeats 3] [--no-hf]
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np

from loadtest.bench_common import hf_scorer, make_work, matmul_peak_flops, shipped_settings
from loadtest.harness import (
    MODEL,
    Option,
    Result,
    Run,
    Workload,
    col,
    counts,
    ratio,
    table,
    timed_together,
)

COLUMNS = (
    col("items", "d"), col("single-item s", ".3f"), col("shared-prefix s", ".3f"),
    col("packed-reference s", ".3f"), col("transformers s", ".3f"),
    col("speed-up vs single", ".1f", "x"), col("speed-up vs transformers", ".1f", "x"),
    col("reference speed-up", ".1f", "x"), col("model FLOP/s / peak", ".0%"),
    col("padding", ".2f"), col("max abs diff multi vs single", ".1e"),
    col("max abs diff vs transformers", ".1e"),
)  # fmt: skip


def engines() -> tuple[dict, object]:
    """The three layouts' engines over one loaded model, and its config."""
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model
    from replicas.engine.scoring_engine import ScoringEngine

    shipped = shipped_settings()
    mesh = build_mesh(shipped.placement.mesh_shape)
    loaded = load_model(shipped.model.name, mesh, shipped.model.dtype)
    variants = {
        "single": shipped.replace(multi_item_scoring_delimiter=None),
        "shared_prefix": shipped,
        "packed_reference": shipped.replace(layout="packed_reference"),
    }
    built = {
        name: ScoringEngine(loaded.model, loaded.params, mesh, settings, MODEL)
        for name, settings in variants.items()
    }
    return built, loaded.config


def one_count(n: int, o: argparse.Namespace, built: dict, config: object, peak: float) -> tuple:
    """Every layout and transformers on one work, timed in turn (``timed_together``) once each
    layout's own signature is compiled; one round for the slow cases at >= 100 items."""
    from replicas.model.flops import multi_item_flops

    work = make_work(n, o.query_tokens, o.item_tokens)
    calls = {name: partial(engine.score_batch, [work]) for name, engine in built.items()}
    for name, engine in built.items():  # a covered shape compiles in the background on recurring
        calls[name](), calls[name]()
        engine.wait_for_background_compiles()
    if o.hf:
        calls["transformers"] = hf_scorer(work)
    prefix = built["shared_prefix"]
    before, answers = prefix.stats(), {}
    seconds = timed_together(calls, 1 if n >= 100 else o.repeats, last=answers)
    after = prefix.stats()
    computed = after["computed_tokens"] - before["computed_tokens"]
    padding = computed / (after["useful_tokens"] - before["useful_tokens"])
    scores = {name: answers[name][0] for name in built} | {"hf": answers.get("transformers")}
    hf_s = seconds.get("transformers")
    hf_diff = None if hf_s is None else float(np.abs(scores["hf"] - scores["single"]).max())
    single, multi, packed = (seconds[k] for k in ("single", "shared_prefix", "packed_reference"))
    flops = multi_item_flops(config, o.query_tokens, [o.item_tokens] * n)
    parity = float(np.abs(scores["shared_prefix"] - scores["single"]).max())
    return (n, single, multi, packed, hf_s, single / multi, ratio(hf_s, multi), single / packed,
            flops / multi / peak, padding, parity, hf_diff)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    import jax

    built, config = engines()
    peak = matmul_peak_flops()
    rows = []
    for n in counts(o.items):
        rows.append(one_count(n, o, built, config, peak))
        run.say(f"{n} items: {rows[-1][1:4]}")
    notes = (
        f"jax {jax.__version__} on {jax.devices()[0].platform}; {MODEL} (GGUF Q4_1 "
        "dequantized to float32), the replica settings of `serve_config.yaml`, query cache off",
        f"request: {o.query_tokens}-token query, {o.item_tokens}-token items, 3 labels; median "
        f"of {o.repeats} rounds, each timing every layout and transformers once in turn, once "
        "the request's own signature is compiled (1 round at >= 100 items)",
        f"measured float32 matmul peak (XLA, best of 512..2048 square): {peak / 1e9:.0f} GFLOP/s",
        "model FLOP/s: analytic FLOPs of the useful multi-item work over the shared-prefix "
        "time; padding: tokens computed / useful tokens of the shared-prefix layout; "
        "transformers: fp32, batched rows, `logits_to_keep=1`",
    )
    title = "Engine, shipped serve_config.yaml settings"
    return [run.result(title, [table(COLUMNS, rows)], notes=notes, figures={"peak": peak})]


WORKLOAD = Workload(
    options=(
        Option("--items", "1,10,100"), Option("--query-tokens", 300),
        Option("--item-tokens", 10), Option("--repeats", 3),
        Option("--no-hf", True, "skip the transformers baseline"),
    ),
    measure=measure,
)  # fmt: skip
