"""GPU benchmark: RFC-008's workload on Qwen3-0.6B-shaped random weights in bf16.

A 300-token query with 10 items of 10 tokens, ``B`` such requests per step for B in 1..64:
items/s of the engine's shared-prefix multi-item step, of its own single-item path, and of
PyTorch transformers batched single-item scoring of the same weights on the same GPU, in one
run. The weights are random (``Qwen3ForCausalLM`` initialised from a seed), saved once as
bf16 safetensors and loaded by ``replicas.checkpoints.loading`` like any local checkpoint, so
both sides compute the same function; needs no download.
Runs where jax sees a GPU (the device tool):

    python -m loadtest.bench_gpu [--batches 1,2,4,8,16,32,64] [--output FILE]

Engine settings are the shipped GPU config's (serve_config.gpu.yaml: bfloat16, batches up to
64, cuDNN attention for causal rows), with the query cache off (every request has its own
query anyway); the same engines with ``attention: xla`` run beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cluster.mesh import build_mesh
from loadtest.bench_common import LABELS, write_section
from loadtest.bench_engine import SERVE_CONFIG, make_work, shipped_settings
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.catalog import HF_CONFIGS
from replicas.model.flops import multi_item_flops, single_item_flops

# config.json values less the keys Qwen3Config takes from its own class.
QWEN3_0_6B = {
    k: v for k, v in HF_CONFIGS["Qwen3-0.6B"].items() if k not in ("model_type", "architectures")
}


# --tiny: the same code path in seconds on a CPU (a smoke run, not a result).
TINY = {
    **QWEN3_0_6B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 50000,
}


def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def save_random_qwen3(directory: Path, shape: dict, seed: int = 0) -> Any:
    """A seeded random Qwen3 model of ``shape``, saved as bf16 safetensors; returns it on the
    torch device."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**shape)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model.to(torch_device())


def torch_timed(fn: Any, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after two warm-up calls (each call returns host
    numpy, so the device is synchronised)."""
    fn(), fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def torch_scorer(model: Any, works: list[ScoreWork]) -> Any:
    """transformers batched single-item rows ``query + item``; returns a scoring function."""
    import torch

    rows = [w.query_ids + item for w in works for item in w.item_ids]
    tokens = torch.tensor(rows, device=torch_device())
    labels = torch.tensor(LABELS, device=torch_device())

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = model(tokens, logits_to_keep=1).logits[:, -1].float()
            return torch.log_softmax(logits, -1)[:, labels].cpu().numpy()

    return score


def engine_timed(engine: ScoringEngine, works: list[ScoreWork], repeats: int) -> float:
    engine.score_batch(works)
    engine.score_batch(works)  # a covered shape compiles in the background once it recurs
    engine.wait_for_background_compiles()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.score_batch(works)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def bf16_peak(size: int, repeats: int = 10) -> float:
    """Measured bf16 matmul FLOP/s through XLA on this GPU (random data)."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, a).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
        out = matmul(a, a)
    out.block_until_ready()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


GPU_CONFIG = SERVE_CONFIG.parent / "serve_config.gpu.yaml"


def build_engines(directory: Path) -> tuple[dict[str, ScoringEngine], Any]:
    settings = shipped_settings(GPU_CONFIG).replace(model=str(directory))
    mesh = build_mesh(settings.placement.mesh_shape)
    loaded = load_model(settings.model.name, mesh, settings.model.dtype)
    xla = settings.replace(attention="xla")  # the same steps without cuDNN's fused attention
    variants = {
        "multi": settings,
        "single": settings.replace(multi_item_scoring_delimiter=None),
        "multi_xla": xla,
        "single_xla": xla.replace(multi_item_scoring_delimiter=None),
    }
    engines = {
        name: ScoringEngine(loaded.model, loaded.params, mesh, s, "qwen3-0.6b-random")
        for name, s in variants.items()
    }
    return engines, loaded.config


def run(args: argparse.Namespace, out: Path | None) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        torch_model = save_random_qwen3(Path(tmp), TINY if args.tiny else QWEN3_0_6B)
        engines, config = build_engines(Path(tmp))
    size = 1024 if args.tiny else 8192
    peak = bf16_peak(size)
    print(f"bf16 matmul peak (XLA, {size}^3): {peak / 1e12:.1f} TFLOP/s", flush=True)
    for batch in args.batches:
        works = [
            make_work(args.items, args.query_tokens, args.item_tokens, seed=s) for s in range(batch)
        ]
        row: dict = {"batch": batch, "items": batch * args.items, "peak": peak}
        scores = {}
        for name, engine in engines.items():
            if name.startswith("single") and batch > args.single_max_batch:
                continue
            row[name] = engine_timed(engine, works, args.repeats)
            scores[name] = np.concatenate(engine.score_batch(works))
        score = torch_scorer(torch_model, works)
        row["torch"] = torch_timed(score, args.repeats)
        reference = score()
        row["diff_multi_torch"] = float(np.abs(scores["multi"] - reference).max())
        if "single" in scores:
            row["diff_multi_single"] = float(np.abs(scores["multi"] - scores["single"]).max())
        lens = [args.item_tokens] * args.items
        row["mfu"] = batch * multi_item_flops(config, args.query_tokens, lens) / row["multi"] / peak
        row["torch_mfu"] = (
            batch * single_item_flops(config, args.query_tokens, lens) / row["torch"] / peak
        )
        row["stats"] = engines["multi"].stats()
        print(format_row(row), flush=True)
        rows.append(row)
        if out:
            (out / "bench_gpu.json").write_text(json.dumps(rows, indent=1))
    return rows


HEADER = (
    "| requests per step | items | multi-item items/s | own single-item items/s "
    "| multi-item, XLA attention | single-item, XLA attention "
    "| transformers items/s | multi vs transformers | multi FLOP/s / peak "
    "| transformers FLOP/s / peak | max abs diff multi vs transformers |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def items_per_s(r: dict, name: str) -> str:
    return f"{r['items'] / r[name]:.0f}" if name in r else "-"


def format_row(r: dict) -> str:
    cells = [
        str(r["batch"]),
        str(r["items"]),
        *(items_per_s(r, name) for name in ("multi", "single", "multi_xla", "single_xla")),
        f"{r['items'] / r['torch']:.0f}",
        f"{r['torch'] / r['multi']:.1f}x",
        f"{100 * r['mfu']:.0f}%",
        f"{100 * r['torch_mfu']:.0f}%",
        f"{r['diff_multi_torch']:.1e}",
    ]
    return "| " + " | ".join(cells) + " |"


SECTION = "## GPU engine, Qwen3-0.6B-shaped random weights in bf16"


def write_report(rows: list[dict], device: str, path: Path) -> None:
    """Replace this benchmark's section of ``path``, keeping every other section."""
    lines = [
        "Engine only (no HTTP: the GPU machine has no Ray), `python -m loadtest.bench_gpu`, on",
        f"{device}. RFC-008's workload: per request a 300-token query and 10 items of 10",
        "tokens, 3 labels; B requests with distinct queries per step (`score_batch`), median of",
        "10 runs once every signature is compiled. Engine settings are the shipped GPU config's",
        "(`serve_config.gpu.yaml`: bfloat16, batches up to 64, single-item steps of 64 x 2048",
        "tokens) with the query cache off. With `attention: auto` the causal rows (prefix steps,",
        "single-item rows) run cuDNN flash attention; the XLA columns run the same engines with",
        "`attention: xla`. transformers: `Qwen3ForCausalLM` with the same",
        "weights, bf16, batched `query + item` rows, `logits_to_keep=1`. Peak: XLA bf16 matmul",
        f"8192^3 on random data, {rows[0]['peak'] / 1e12:.0f} TFLOP/s. Model FLOP/s count the",
        "useful work of each side (multi-item: query once; transformers: query per item).",
        "The differences are bf16 rounding (different summation order), not layout error:",
        "the float32 parity tests hold the layouts to 1e-5.",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    write_section(path, SECTION, "\n".join(lines))


def versions() -> str:
    import torch
    import transformers

    return (
        f"jax {jax.__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--query-tokens", type=int, default=300)
    parser.add_argument("--item-tokens", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--single-max-batch", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="tiny shape: a CPU smoke run")
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    # Read when jax first touches the GPU (below), not at import: torch shares the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}", flush=True)
    print(HEADER, flush=True)
    rows = run(args, out)
    print("\n".join([HEADER, *(format_row(r) for r in rows)]))
    if not args.tiny:
        write_report(rows, f"{jax.devices()[0].device_kind} ({versions()})", Path(args.output))


if __name__ == "__main__":
    main()
