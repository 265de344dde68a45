"""Benchmark: multi-item vs single-item scoring on the real SmolLM2-135M-Instruct.

For N items behind a 300-token query (10-token items) it times the engine's single-item,
shared-prefix and packed-reference layouts, built with the replica settings of the shipped
serve_config.yaml, and transformers' batched single-item scoring, all side by side in one run
on the same CPU and weights; measures this machine's float32 matmul peak and the padding, and
writes its section of docs/benchmarks.md (the end-to-end HTTP section is
``loadtest.bench_serve``'s).

    python -m loadtest.bench_engine [--items 1,10,100] [--repeats 3] [--no-hf]
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import jax
import numpy as np
import yaml

from cluster.mesh import build_mesh
from loadtest.bench_common import (
    LABELS,
    MODEL,
    hf_scorer,
    matmul_peak_flops,
    timed,
    write_section,
)
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.flops import multi_item_flops
from replicas.settings import ReplicaSettings

SERVE_CONFIG = Path(__file__).resolve().parent.parent / "serve_config.yaml"
SECTION = "## Engine, shipped serve_config.yaml settings"


def make_work(num_items: int, query_len: int, item_len: int, seed: int = 0) -> ScoreWork:
    rng = np.random.default_rng(seed)
    ids = lambda n: tuple(int(t) for t in rng.integers(100, 40000, n))  # noqa: E731
    return ScoreWork(ids(query_len), tuple(ids(item_len) for _ in range(num_items)), LABELS)


def shipped_settings(config: Path = SERVE_CONFIG) -> ReplicaSettings:
    """The replica settings of the shipped serve_config.yaml (its first application's args),
    without its warm-up (the benchmark warms each case with one untimed call; so without
    ``limit_to_warmup`` either), disk cache or query cache (each case repeats one request,
    which the cache would answer warm; the HTTP benchmark measures the cache)."""
    (app, *_) = yaml.safe_load(config.read_text())["applications"]
    settings = ReplicaSettings.from_mapping(app["args"])
    return settings.replace(
        warmup_shapes=(),
        limit_to_warmup=False,
        compilation_cache_dir=None,
        query_cache_bytes=0,
    )


def timed_steady(engine: ScoringEngine, work: ScoreWork, repeats: int) -> float:
    """Median seconds once the work's own signature is compiled: a shape that a compiled
    signature covers compiles in the background when it recurs, so two untimed calls."""
    engine.score_batch([work])
    engine.score_batch([work])
    engine.wait_for_background_compiles()
    return timed(lambda: engine.score_batch([work]), repeats)


def run(items: list[int], query_len: int, item_len: int, repeats: int, hf: bool) -> list[dict]:
    shipped = shipped_settings()
    mesh = build_mesh(shipped.placement.mesh_shape)
    loaded = load_model(shipped.model.name, mesh, shipped.model.dtype)
    variants = {
        "single": shipped.replace(multi_item_scoring_delimiter=None),
        "shared_prefix": shipped,
        "packed_reference": shipped.replace(layout="packed_reference"),
    }
    engines = {
        name: ScoringEngine(loaded.model, loaded.params, mesh, settings, MODEL)
        for name, settings in variants.items()
    }
    peak = matmul_peak_flops()
    rows = []
    for n in items:
        work = make_work(n, query_len, item_len)
        row: dict = {"items": n, "peak": peak}
        scores = {}
        for name, engine in engines.items():
            reps = 1 if name != "shared_prefix" and n >= 100 else repeats
            before = engine.stats()
            row[name] = timed_steady(engine, work, reps)
            scores[name] = engine.score_batch([work])[0]
            if name == "shared_prefix":
                after = engine.stats()
                computed = after["computed_tokens"] - before["computed_tokens"]
                row["padding"] = computed / (after["useful_tokens"] - before["useful_tokens"])
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


HEADER = (
    "| items | single-item s | shared-prefix s | packed-reference s | transformers s "
    "| speed-up vs single | speed-up vs transformers | reference speed-up "
    "| model FLOP/s / peak | padding | max abs diff multi vs single "
    "| max abs diff vs transformers |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
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
        _cell(r.get("padding"), ".2f"),
        _cell(r["parity"], ".1e"),
        _cell(r.get("hf_diff"), ".1e"),
    ]
    return "| " + " | ".join(cells) + " |"


def write_report(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    """Replace this benchmark's section of ``path``, keeping every other section."""
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    lines = [
        "Engine only (no HTTP), `make bench` (`python -m loadtest.bench_engine`), with the",
        f"replica settings of `serve_config.yaml`; {MODEL} (GGUF Q4_1 dequantized to float32).",
        "",
        f"- machine: {machine}, jax {jax.__version__} on {jax.devices()[0].platform}",
        f"- request: {args.query_tokens}-token query, {args.item_tokens}-token items, "
        f"{len(LABELS)} labels; median of {args.repeats} runs once the request's own signature "
        "is compiled (1 run for the slow single-item cases at >= 100 items)",
        "- measured float32 matmul peak (XLA, best of 512..2048 square): "
        f"{rows[0]['peak'] / 1e9:.0f} GFLOP/s",
        "- query cache off (every timed request computes its query); otherwise as shipped",
        "- model FLOP/s: analytic FLOPs of the useful (unpadded) multi-item work divided by the",
        "  shared-prefix time; padding: tokens computed / useful tokens of the shared-prefix",
        "  layout; transformers: fp32, batched rows, `logits_to_keep=1`",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    write_section(path, SECTION, "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", default="1,10,100")
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
