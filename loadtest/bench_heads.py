"""Benchmark: best-of-N reward scoring with a score head, multi-item against each
conversation alone (the engine's own single-item path) and against transformers.

A Qwen3-0.6B-shaped ``Qwen3ForSequenceClassification`` (one label, random weights, saved with
``save_pretrained`` into a temporary directory and loaded like any checkpoint) scores a
300-token prompt with N responses of 50 tokens: the engine with the shipped serve_config.yaml
settings runs the prompt once and the responses as items behind it; the same engine without
multi-item scores every conversation (prompt + response) as its own row; transformers'
``AutoModelForSequenceClassification`` (fp32) scores the N conversations as one batch. All
side by side in one run (timed in turn), on the same CPU and weights.

    python -m loadtest run heads [--responses 8,64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from loadtest import peers
from loadtest.bench_common import (
    build_engines,
    contenders,
    diff,
    make_work,
    random_checkpoint,
    shipped_settings,
)
from loadtest.harness import Option, Result, Run, Workload, col, counts, table, timed_together
from replicas.model.catalog import HF_CONFIGS

SHAPE = "Qwen3-0.6B"


def reward_shape(layers: int) -> dict[str, Any]:
    """Qwen3-0.6B's config as a one-label seq-cls model of ``layers`` decoder layers."""
    return {**HF_CONFIGS[SHAPE], "num_labels": 1, "pad_token_id": 0, "num_hidden_layers": layers,
            "architectures": ["Qwen3ForSequenceClassification"]}  # fmt: skip


def run_sizes(
    responses: list[int], prompt_len: int, response_len: int, repeats: int, layers: int, run: Run
) -> list[dict]:
    # every signature compiles on its first call, not in the background
    shipped = shipped_settings().replace(background_compile=False)
    variants = {"multi": shipped, "single": shipped.replace(multi_item_scoring_delimiter=None)}
    with tempfile.TemporaryDirectory() as folder:
        hf_model = random_checkpoint(Path(folder), reward_shape(layers))
        engines, _ = build_engines(shipped, variants, SHAPE, Path(folder))
    rows = []
    for n in responses:
        work = make_work(n, prompt_len, response_len, labels=(0,))  # the head's one output
        hf = peers.hf_rewards(hf_model, work)
        if n < 64:
            hf()  # at 64 transformers runs without a warm-up
        calls = {**contenders(engines, [work]), "transformers": hf}
        seconds = timed_together(calls, 1 if n >= 64 else repeats, warm=0)
        scores = seconds.last
        row: dict = {"responses": n, **seconds}
        row["parity"] = diff(scores, "multi", "single")
        row["hf_diff"] = diff(scores, "transformers", "multi")
        row["token_ratio"] = n * (prompt_len + response_len) / (prompt_len + n * response_len)
        run.say(f"{n} responses: {row_cells(row)}")
        rows.append(row)
    return rows


COLUMNS = (
    col("responses", "d"), col("multi-item s", ".2f"), col("each conversation alone s", ".2f"),
    col("transformers batched s", ".2f"), col("token ratio", ".1f"),
    col("speed-up vs alone", ".1f", "x"), col("speed-up vs transformers", ".1f", "x"),
    col("max abs diff multi vs alone", ".1e"), col("max abs diff vs transformers", ".1e"),
)  # fmt: skip


def row_cells(r: dict) -> tuple:
    multi, single, hf = r["multi"], r["single"], r["transformers"]
    return (r["responses"], multi, single, hf, r["token_ratio"], single / multi, hf / multi,
            r["parity"], r["hf_diff"])  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    rows = run_sizes(
        counts(o.responses), o.prompt_tokens, o.response_tokens, o.repeats, o.layers, run
    )
    notes = (
        "a Qwen3-0.6B-shaped `Qwen3ForSequenceClassification` (one label, random weights, "
        f"float32; hidden 1024, 16/8 heads, MLP 3072, vocabulary 151936, {o.layers} decoder "
        "layers) scores a prompt and N responses: multi-item (the prompt once, the responses as "
        "items behind it), each conversation alone (the engine's single-item rows, "
        "`multi_item_scoring_delimiter: null`) and transformers' "
        "`AutoModelForSequenceClassification` over the N conversations as one batch",
        f"request: {o.prompt_tokens}-token prompt, responses of {o.response_tokens} tokens; "
        f"median of {o.repeats} rounds once compiled, each round one call of each contender in "
        "turn (1 round at >= 64 responses, transformers there without a warm-up)",
        "shipped serve_config.yaml settings, query cache off; token ratio: tokens of the N "
        "conversations alone / tokens multi-item computes (the ideal speed-up)",
    )
    tables = [table(COLUMNS, [row_cells(r) for r in rows])]
    return [run.result("Best-of-N reward scoring with a score head", tables, notes=notes)]


WORKLOAD = Workload(
    options=(
        Option("--responses", "8,64"), Option("--prompt-tokens", 300),
        Option("--response-tokens", 50), Option("--repeats", 3),
        Option("--layers", 28, "decoder layers (Qwen3-0.6B has 28)"),
    ),
    measure=measure,
)  # fmt: skip
