"""Benchmark: what a small request costs, and where a step's time goes on this CPU.

    python -m loadtest.bench_small [--url http://127.0.0.1:8000] [--repeats 10]

1. Step cost against tokens (the shipped serve_config.yaml's settings, SmolLM2-135M-Instruct
   in float32, in this process): fused steps of 16 to 256 tokens and prefix steps, each a
   median of ``--repeats``; a least-squares line ``seconds = fixed + per_token x tokens``; the
   weights' bytes (every pass reads them all once) and this machine's read bandwidth (a
   float32 sum over a 1 GiB array), whose quotient is the floor of any pass.
2. With ``--url`` (a running ``make serve``): a 9-token query with 2 items (``""`` and
   ``" not"``) and 3 labels over HTTP, median of ``--repeats``, against transformers scoring
   the same two rows in the same run: one forward per row (two weight passes, what scoring
   them one at a time costs) and both rows in one padded forward.

Prints the tables and writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench_common import LABELS, load_hf_model, machine_description, timed, write_section
from loadtest.bench_engine import shipped_settings

SECTION = "## Small requests: one weight pass"
QUERY = "Is Paris the capital of France? Answer:"  # 9 tokens (SmolLM2 adds no BOS)
ITEMS = ["", " not"]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Best bytes/s of summing a ``gib`` GiB float32 array (reads it once)."""
    data = np.ones(int(gib * 2**30) // 4, np.float32)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = max(best, data.nbytes / (time.perf_counter() - start))
    return best


def step_costs(repeats: int) -> dict[str, Any]:
    """Median seconds of fused and prefix steps of several widths, the fitted line, the
    weights' bytes and the floor they give at this machine's bandwidth."""
    import jax

    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model
    from replicas.contract import ScoreWork
    from replicas.engine.scoring_engine import ScoringEngine

    settings = shipped_settings().replace(background_compile=False)
    loaded = load_model(settings.model, build_mesh(settings.mesh_shape), settings.dtype)
    engine = ScoringEngine(loaded.model, loaded.params, loaded.params["embed"].sharding.mesh,
                           settings, settings.model)  # fmt: skip
    rows = []
    for width in (16, 32, 64, 128, 256):  # one work filling a fused row exactly
        work = ScoreWork((100,) * (width - 2), ((200,), (300,)), LABELS)
        seconds = timed(lambda w=work: engine.score_batch([w]), repeats)
        rows.append({"step": "fused", "tokens": width, "seconds": seconds})
    no_fuse = ScoringEngine(loaded.model, loaded.params, loaded.params["embed"].sharding.mesh,
                            settings.replace(fused_step_tokens=0, query_cache_bytes=0),
                            settings.model)  # fmt: skip
    for width in (16, 64, 256):  # a prefix step, then a 16-token item step, per request
        work = ScoreWork((100,) * width, ((200,),), LABELS)
        seconds = timed(lambda w=work: no_fuse.score_batch([w]), repeats)
        rows.append({"step": "prefix + items", "tokens": width + 16, "seconds": seconds})
    fused = [r for r in rows if r["step"] == "fused"]
    slope, fixed = np.polyfit([r["tokens"] for r in fused], [r["seconds"] for r in fused], 1)
    weights = sum(int(leaf.nbytes) for leaf in jax.tree.leaves(loaded.params))
    bandwidth = read_bandwidth()
    wide = ScoringEngine(loaded.model, loaded.params, loaded.params["embed"].sharding.mesh,
                         settings.replace(fused_step_tokens=1024, query_cache_bytes=0),
                         settings.model)  # fmt: skip
    return {
        "rows": rows,
        "row_widths": row_widths(wide, repeats),
        "fixed_s": float(fixed),
        "per_token_s": float(slope),
        "weight_bytes": weights,
        "bandwidth": bandwidth,
        "floor_s": weights / bandwidth,
    }


def row_widths(engine: Any, repeats: int) -> list[dict[str, Any]]:
    """What the fused row's width costs a burst: 12 works of a 60-word query (80 tokens) and
    two 5-token items, run 2, 5 or 11 to a row (rows of 256, 512 or 1024 tokens)."""
    from replicas.contract import ScoreWork

    rng = np.random.default_rng(0)
    works = [
        ScoreWork(tuple(map(int, rng.integers(100, 40000, 80))),
                  tuple(tuple(map(int, rng.integers(100, 40000, 5))) for _ in range(2)), LABELS)
        for _ in range(12)
    ]  # fmt: skip
    rows = []
    for per_row in (2, 5, 11):
        calls = [works[start : start + per_row] for start in range(0, len(works), per_row)]
        seconds = timed(lambda c=calls: [engine.score_batch(call) for call in c], repeats)
        rows.append({"per_row": per_row, "steps": len(calls), "seconds": seconds})
    return rows


def http_small(url: str, repeats: int) -> dict[str, float]:
    """The small request over HTTP against transformers on the same two rows."""
    import httpx
    import torch

    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    tokenizer = load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct"))
    query = tokenizer(QUERY)["input_ids"]
    rows = [query + tokenizer(item, add_special_tokens=False)["input_ids"] for item in ITEMS]
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": list(LABELS)}
    with httpx.Client(base_url=url, timeout=60) as client:
        served = timed(lambda: client.post("/v1/score", json=body).raise_for_status(), repeats)
    model = load_hf_model()
    padded = torch.tensor([row + [0] * (len(rows[-1]) - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (padded.shape[1] - len(row)) for row in rows])

    def one_at_a_time() -> None:
        with torch.inference_mode():
            for row in rows:
                model(torch.tensor([row]), logits_to_keep=1)

    def batched() -> None:
        with torch.inference_mode():
            model(padded, attention_mask=mask)

    return {
        "query_tokens": len(query),
        "served_s": served,
        "hf_rows_s": timed(one_at_a_time, repeats),
        "hf_batched_s": timed(batched, repeats),
    }


def report(costs: dict[str, Any] | None, small: dict[str, float] | None) -> str:
    command = f"python -m loadtest.bench_small{' --url URL' if small else ''}"
    lines = [
        f"`{command}` on {machine_description()} (shipped serve_config.yaml settings, float32).",
    ]
    if costs:
        lines += step_lines(costs)
    if small:
        lines += small_lines(small)
    return "\n".join(lines) + "\n"


def step_lines(costs: dict[str, Any]) -> list[str]:
    return [
        "",
        "| step | tokens | median s |",
        "|---|---:|---:|",
        *(f"| {r['step']} | {r['tokens']} | {r['seconds']:.3f} |" for r in costs["rows"]),
        "",
        f"Fused steps fit `{costs['fixed_s']:.3f} s + {costs['per_token_s'] * 1e3:.2f} ms x "
        f"tokens`. The weights are {costs['weight_bytes'] / 1e6:.0f} MB and every pass reads "
        f"them once; this machine reads {costs['bandwidth'] / 1e9:.1f} GB/s (a float32 sum "
        f"over 1 GiB), a floor of {costs['floor_s']:.3f} s per pass.",
        "",
        "12 works of an 80-token query and two 5-token items (a burst of 60-word queries), "
        "fused rows of different widths:",
        "",
        "| works per row | steps | median s for the 12 |",
        "|---:|---:|---:|",
        *(f"| {r['per_row']} | {r['steps']} | {r['seconds']:.3f} |" for r in costs["row_widths"]),
    ]


def small_lines(small: dict[str, float]) -> list[str]:
    ratio = small["served_s"] / small["hf_rows_s"]
    return [
        "",
        f'A {small["query_tokens"]}-token query with 2 items (`""`, `" not"`), 3 labels, '
        "over HTTP against `make serve`, and transformers on the same two rows (fp32, "
        "same weights, same run):",
        "",
        "| what | median s |",
        "|---|---:|",
        f"| scorejax, `/v1/score` over HTTP | {small['served_s']:.3f} |",
        f"| transformers, one forward per row (two passes) | {small['hf_rows_s']:.3f} |",
        f"| transformers, both rows in one padded forward | {small['hf_batched_s']:.3f} |",
        "",
        f"Served / transformers' two rows: **{ratio:.2f}x** (target <= 0.6x).",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running make serve, for the HTTP comparison")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--no-steps", action="store_true", help="the HTTP comparison only")
    args = parser.parse_args(argv)
    small = http_small(args.url, args.repeats) if args.url else None
    text = report(None if args.no_steps else step_costs(args.repeats), small)
    print(text)
    if not args.no_write:
        write_section(DOCS, SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
