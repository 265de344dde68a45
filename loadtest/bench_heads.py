"""Benchmark: best-of-N reward scoring with a score head, multi-item against each
conversation alone (the engine's own single-item path) and against transformers.

A Qwen3-0.6B-shaped ``Qwen3ForSequenceClassification`` (one label, random weights, saved with
``save_pretrained`` into a temporary directory and loaded like any checkpoint) scores a
300-token prompt with N responses of 50 tokens: the engine with the shipped serve_config.yaml
settings runs the prompt once and the responses as items behind it; the same engine without
multi-item scores every conversation (prompt + response) as its own row; transformers'
``AutoModelForSequenceClassification`` (fp32) scores the N conversations as one batch. All
side by side in one run, on the same CPU and weights; writes its section of
docs/benchmarks.md.

    python -m loadtest.bench_heads [--responses 8,64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from cluster.mesh import build_mesh
from loadtest.bench_common import machine_description, write_section
from loadtest.bench_engine import shipped_settings
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.catalog import HF_CONFIGS

SECTION = "## Best-of-N reward scoring with a score head"
SHAPE = "Qwen3-0.6B"


def save_reward_model(directory: Path, layers: int) -> Any:
    """A random Qwen3-0.6B-shaped one-label seq-cls model with ``layers`` decoder layers in
    ``directory``; returns it."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from replicas.model.catalog import hf_config

    torch.manual_seed(0)
    values = {**HF_CONFIGS[SHAPE], "num_labels": 1, "pad_token_id": 0}
    values["num_hidden_layers"] = layers
    config = hf_config({**values, "architectures": ["Qwen3ForSequenceClassification"]})
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # transformers' init leaves score at N(0, 0.02): a wider spread
        model.score.weight.normal_(0.0, model.config.hidden_size**-0.5)
    model.save_pretrained(directory, safe_serialization=True)
    return model


def best_of_n(responses: int, prompt_len: int, response_len: int, seed: int = 0) -> ScoreWork:
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(100, 40000, n))  # noqa: E731
    return ScoreWork(ids(prompt_len), tuple(ids(response_len) for _ in range(responses)), (0,))


def hf_rewards(model: Any, work: ScoreWork) -> Any:
    """transformers' batched scoring of the N conversations (equal lengths: no padding)."""
    import torch

    rows = torch.tensor([work.query_ids + item for item in work.item_ids])

    def score() -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=rows).logits.float().numpy()  # [N, 1]

    return score


def interleaved(fns: dict[str, Any], repeats: int, warm: set[str]) -> tuple[dict, dict]:
    """Median seconds of each function over ``repeats`` rounds, one call of each per round
    (so a load that comes and goes on a shared machine falls on all of them alike), after
    one untimed call of those in ``warm`` (the engines compile their signatures there);
    and each one's last result."""
    results = {name: fns[name]() for name in warm}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}, results


def run(
    responses: list[int],
    prompt_len: int,
    response_len: int,
    repeats: int,
    layers: int,
    done: Any = None,
) -> list[dict]:
    # every signature compiles on its first call, not in the background: one warm-up call
    shipped = shipped_settings().replace(background_compile=False)
    with tempfile.TemporaryDirectory() as folder:
        hf_model = save_reward_model(Path(folder), layers)
        mesh = build_mesh(shipped.placement.mesh_shape)
        loaded = load_model(folder, mesh, "float32")
    engines = {
        "multi": ScoringEngine(loaded.model, loaded.params, mesh, shipped, SHAPE),
        "single": ScoringEngine(
            loaded.model,
            loaded.params,
            mesh,
            shipped.replace(multi_item_scoring_delimiter=None),
            SHAPE,
        ),
    }
    rows = []
    for n in responses:
        work = best_of_n(n, prompt_len, response_len)
        reps = 1 if n >= 64 else repeats
        row: dict = {"responses": n}
        fns = {
            name: (lambda e=engine, w=work: e.score_batch([w])[0])
            for name, engine in engines.items()
        }
        fns["transformers"] = hf_rewards(hf_model, work)
        warm = {"multi", "single", *(["transformers"] if n < 64 else [])}
        times, scores = interleaved(fns, reps, warm)
        row.update(times)
        reference = scores["transformers"]
        row["parity"] = float(np.abs(scores["multi"] - scores["single"]).max())
        row["hf_diff"] = float(np.abs(reference - scores["multi"]).max())
        row["token_ratio"] = n * (prompt_len + response_len) / (prompt_len + n * response_len)
        print(format_row(row), flush=True)
        rows.append(row)
        if done is not None:
            done(rows)  # the report so far, should a later size not finish
    return rows


HEADER = (
    "| responses | multi-item s | each conversation alone s | transformers batched s "
    "| token ratio | speed-up vs alone | speed-up vs transformers "
    "| max abs diff multi vs alone | max abs diff vs transformers |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def format_row(r: dict) -> str:
    cells = [
        str(r["responses"]),
        f"{r['multi']:.2f}",
        f"{r['single']:.2f}",
        f"{r['transformers']:.2f}",
        f"{r['token_ratio']:.1f}",
        f"{r['single'] / r['multi']:.1f}x",
        f"{r['transformers'] / r['multi']:.1f}x",
        f"{r['parity']:.1e}",
        f"{r['hf_diff']:.1e}",
    ]
    return "| " + " | ".join(cells) + " |"


def write_report(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    lines = [
        "`python -m loadtest.bench_heads`: a Qwen3-0.6B-shaped `Qwen3ForSequenceClassification`",
        "(one label, random weights, float32) scores a prompt and N responses: multi-item (the",
        "prompt once, the responses as items behind it), each conversation alone (the engine's",
        "single-item rows, `multi_item_scoring_delimiter: null`) and transformers'",
        "`AutoModelForSequenceClassification` over the N conversations as one batch.",
        "",
        f"- machine: {machine_description()}; model: Qwen3-0.6B's widths (hidden 1024, 16/8",
        f"  heads, MLP 3072, vocabulary 151936) with {args.layers} decoder layers",
        f"- request: {args.prompt_tokens}-token prompt, responses of {args.response_tokens} "
        f"tokens; median of {args.repeats} rounds once compiled, each round one call of each",
        "  contender in turn (1 round at >= 64 responses, transformers there without a warm-up)",
        "- shipped serve_config.yaml settings, query cache off; token ratio: tokens of the N",
        "  conversations alone / tokens multi-item computes (the ideal speed-up)",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    write_section(path, SECTION, "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", default="8,64")
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--response-tokens", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-0.6B has 28)")
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    responses = [int(n) for n in args.responses.split(",")]
    print(HEADER, flush=True)
    report = lambda rows: write_report(rows, args, Path(args.output))  # noqa: E731
    run(responses, args.prompt_tokens, args.response_tokens, args.repeats, args.layers, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
