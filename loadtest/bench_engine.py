"""Benchmark: multi-item vs single-item scoring on the real SmolLM2-135M-Instruct.

For N items behind a 300-token query (10-token items) it times the engine's single-item,
shared-prefix and packed-reference layouts and transformers' batched single-item scoring,
all side by side in one run on the same CPU and weights, measures this machine's float32
matmul peak, and writes the table into docs/benchmarks.md.

    python -m loadtest.bench_engine [--items 1,10,100,128] [--repeats 3] [--no-hf]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cluster.mesh import build_mesh
from loadtest.flops import multi_item_flops
from replicas.contract import ScoreWork
from replicas.engine import ScoringEngine
from replicas.loading import load_model
from replicas.settings import ReplicaSettings

MODEL = "SmolLM2-135M-Instruct"
LABELS = (7042, 4528, 11452)  # " Paris", " London", " Berlin"
DELIMITER = 0  # <|endoftext|>


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls after one untimed warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def matmul_peak_flops(sizes: tuple[int, ...] = (512, 1024, 1536, 2048), repeats: int = 8) -> float:
    """Best observed float32 matmul FLOP/s of this machine through XLA, over a few sizes."""
    matmul = jax.jit(lambda x, y: x @ y)
    best = 0.0
    for size in sizes:
        a = jnp.ones((size, size), jnp.float32)
        matmul(a, a).block_until_ready()
        for _ in range(repeats):
            start = time.perf_counter()
            matmul(a, a).block_until_ready()
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def make_work(num_items: int, query_len: int, item_len: int, seed: int = 0) -> ScoreWork:
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(100, 40000, n))  # noqa: E731
    return ScoreWork(ids(query_len), tuple(ids(item_len) for _ in range(num_items)), LABELS)


def hf_scorer(work: ScoreWork) -> Callable[[], np.ndarray]:
    """transformers fp32 batched single-item scoring of the same GGUF weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from replicas.sources import resolve_model_source

    torch.set_num_threads(os.cpu_count() or 1)
    source = resolve_model_source(MODEL)
    model = AutoModelForCausalLM.from_pretrained(
        str(source.directory), dtype=torch.float32, **source.transformers_kwargs()
    ).eval()
    rows = torch.tensor([work.query_ids + item for item in work.item_ids])
    labels = torch.tensor(work.label_ids)

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = model(rows, logits_to_keep=1).logits[:, -1]
            return torch.log_softmax(logits, -1)[:, labels].numpy()

    return score


def run(items: list[int], query_len: int, item_len: int, repeats: int, hf: bool) -> list[dict]:
    mesh = build_mesh((1, 1))
    loaded = load_model(MODEL, mesh)
    base = ReplicaSettings(model=MODEL)
    engines = {
        "single": ScoringEngine(loaded.model, loaded.params, mesh, base, MODEL),
        "shared_prefix": ScoringEngine(
            loaded.model,
            loaded.params,
            mesh,
            base.replace(multi_item_scoring_delimiter=DELIMITER),
            MODEL,
        ),
        "packed_reference": ScoringEngine(
            loaded.model,
            loaded.params,
            mesh,
            base.replace(multi_item_scoring_delimiter=DELIMITER, layout="packed_reference"),
            MODEL,
        ),
    }
    peak = matmul_peak_flops()
    rows = []
    for n in items:
        work = make_work(n, query_len, item_len)
        row: dict = {"items": n, "peak": peak}
        scores = {}
        for name, engine in engines.items():
            reps = 1 if name != "shared_prefix" and n >= 100 else repeats
            row[name] = timed(lambda e=engine, w=work: e.score_batch([w]), reps)
            scores[name] = engine.score_batch([work])[0]
        if hf:
            score = hf_scorer(work)
            row["transformers"] = timed(score, 1 if n >= 100 else repeats)
            row["hf_diff"] = float(np.abs(score() - scores["single"]).max())
        row["parity"] = float(np.abs(scores["shared_prefix"] - scores["single"]).max())
        flops = multi_item_flops(loaded.config, query_len, [item_len] * n)
        row["mfu"] = flops / row["shared_prefix"] / peak
        print(format_row(row), flush=True)
        rows.append(row)
    return rows


NOTES_MARKER = "<!-- analysis: kept across runs -->"
HEADER = (
    "| items | single-item s | shared-prefix s | packed-reference s | transformers s "
    "| speed-up vs single | speed-up vs transformers | reference speed-up "
    "| model FLOP/s / peak | max abs diff multi vs single | max abs diff vs transformers |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_row(r: dict) -> str:
    hf = r.get("transformers")
    cells = [
        str(r["items"]),
        _cell(r["single"], ".3f"),
        _cell(r["shared_prefix"], ".3f"),
        _cell(r["packed_reference"], ".3f"),
        _cell(hf, ".3f"),
        f"{r['single'] / r['shared_prefix']:.1f}x",
        "-" if hf is None else f"{hf / r['shared_prefix']:.1f}x",
        f"{r['single'] / r['packed_reference']:.1f}x",
        f"{100 * r['mfu']:.0f}%",
        _cell(r["parity"], ".1e"),
        _cell(r.get("hf_diff"), ".1e"),
    ]
    return "| " + " | ".join(cells) + " |"


def write_report(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m loadtest.bench_engine`); every figure in a table",
        "comes from one run, side by side, so ratios are comparable while absolute times on a",
        "shared machine are noisy.",
        "",
        f"## Multi-item scoring, {MODEL} (GGUF Q4_1 dequantized to float32), CPU",
        "",
        f"- machine: {machine}, jax {jax.__version__} on {jax.devices()[0].platform}",
        f"- request: {args.query_tokens}-token query, {args.item_tokens}-token items, "
        f"{len(LABELS)} labels; median of {args.repeats} runs after a warm-up "
        "(1 run for the slow single-item cases at >= 100 items)",
        "- measured float32 matmul peak (XLA, best of 512..2048 square): "
        f"{rows[0]['peak'] / 1e9:.0f} GFLOP/s",
        "- model FLOP/s: analytic FLOPs of the useful (unpadded) multi-item work divided by the",
        "  shared-prefix time; transformers: fp32, batched rows, `logits_to_keep=1`",
        "",
        HEADER,
        *(format_row(r) for r in rows),
        "",
    ]
    kept = path.read_text().partition(NOTES_MARKER) if path.exists() else ("", "", "")
    path.write_text("\n".join(lines) + (kept[1] + kept[2] if kept[1] else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", default="1,10,100,128")
    parser.add_argument("--query-tokens", type=int, default=300)
    parser.add_argument("--item-tokens", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    items = [int(n) for n in args.items.split(",")]
    print(HEADER, flush=True)
    rows = run(items, args.query_tokens, args.item_tokens, args.repeats, not args.no_hf)
    write_report(rows, args, Path(args.output))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
