"""GPU benchmark: RFC-008's workload on Qwen3-0.6B-shaped random weights in bf16.

A 300-token query with 10 items of 10 tokens, ``B`` such requests per step for B in 1..64:
items/s of the engine's shared-prefix multi-item step, of its own single-item path, and of
PyTorch transformers batched single-item scoring of the same weights on the same GPU, in one
run. The weights are random (``Qwen3ForCausalLM`` initialised from a seed), saved once as
bf16 safetensors and loaded by ``replicas.checkpoints.loading`` like any local checkpoint, so
both sides compute the same function; needs no download.
Runs where jax sees a GPU (the device tool):

    python -m loadtest run gpu [--batches 1,2,4,8,16,32,64] [--out $OUT]

Engine settings are the shipped GPU config's (serve_config.gpu.yaml: bfloat16, batches up to
64, cuDNN attention for causal rows), with the query cache off (every request has its own
query anyway); the same engines with ``attention: xla`` run beside them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from loadtest import bench_common as common
from loadtest import peers
from loadtest.harness import Option, Result, Run, Workload, col, counts, table, timed_together
from replicas.model.catalog import HF_CONFIGS
from replicas.model.flops import multi_item_flops, single_item_flops

QWEN3_0_6B = HF_CONFIGS["Qwen3-0.6B"]
# --tiny: the same code path in seconds on a CPU (a smoke run, not a result).
TINY = {
    **QWEN3_0_6B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 50000,
}  # fmt: skip


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


def build_engines(directory: Path) -> tuple[dict, object]:
    """The shipped GPU settings' engines, multi-item and single-item, each with cuDNN's
    attention and with XLA's; and the model's config."""
    settings = common.shipped_settings(common.GPU_CONFIG).replace(model=str(directory))
    xla = settings.replace(attention="xla")  # the same steps without cuDNN's fused attention
    variants = {
        "multi": settings,
        "single": settings.replace(multi_item_scoring_delimiter=None),
        "multi_xla": xla,
        "single_xla": xla.replace(multi_item_scoring_delimiter=None),
    }
    engines, loaded = common.build_engines(settings, variants, "qwen3-0.6b-random")
    return engines, loaded.config


def run_batches(args: argparse.Namespace, run: Run) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        shape = TINY if args.tiny else QWEN3_0_6B
        torch_model = common.random_checkpoint(Path(tmp), shape, "bfloat16", common.torch_device())
        engines, config = build_engines(Path(tmp))
    size = 1024 if args.tiny else 8192
    peak = bf16_peak(size)
    run.say(f"bf16 matmul peak (XLA, {size}^3): {peak / 1e12:.1f} TFLOP/s")
    for batch in args.batches:
        works = [
            common.make_work(args.items, args.query_tokens, args.item_tokens, seed=s)
            for s in range(batch)
        ]
        row: dict = {"batch": batch, "items": batch * args.items, "peak": peak}
        single = batch <= args.single_max_batch
        built = {k: e for k, e in engines.items() if single or not k.startswith("single")}
        score = peers.hf_scorer(works, torch_model)
        score(), score()  # each call returns host numpy
        calls = {**common.contenders(built, works), "torch": score}
        seconds = timed_together(calls, args.repeats, warm=0)
        row |= seconds
        row["diff_multi_torch"] = common.diff(seconds.last, "multi", "torch")
        row["diff_multi_single"] = common.diff(seconds.last, "multi", "single")
        lens = [args.item_tokens] * args.items
        row["mfu"] = batch * multi_item_flops(config, args.query_tokens, lens) / row["multi"] / peak
        row["torch_mfu"] = (
            batch * single_item_flops(config, args.query_tokens, lens) / row["torch"] / peak
        )
        row["stats"] = engines["multi"].stats().as_dict()
        run.say(str(row_cells(row)))
        rows.append(row)
    return rows


COLUMNS = (
    col("requests per step", "d"), col("items", "d"), col("multi-item items/s", ".0f"),
    col("own single-item items/s", ".0f"), col("multi-item, XLA attention", ".0f"),
    col("single-item, XLA attention", ".0f"), col("transformers items/s", ".0f"),
    col("multi vs transformers", ".1f", "x"), col("multi FLOP/s / peak", ".0%"),
    col("transformers FLOP/s / peak", ".0%"), col("max abs diff multi vs transformers", ".1e"),
)  # fmt: skip


def row_cells(r: dict) -> tuple:
    per_s = [r["items"] / r[k] if k in r else None for k in ("multi", "single", "multi_xla",
             "single_xla", "torch")]  # fmt: skip
    return (r["batch"], r["items"], *per_s, r["torch"] / r["multi"], r["mfu"], r["torch_mfu"],
            r["diff_multi_torch"])  # fmt: skip


def versions() -> str:
    import torch
    import transformers

    return (
        f"jax {jax.__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    )


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    o.batches = counts(o.batches)
    # Read when jax first touches the GPU (below), not at import: torch shares the GPU.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    rows = run_batches(o, run)
    notes = (
        "engine only (no HTTP: the GPU machine has no Ray); RFC-008's workload: per request a "
        f"{o.query_tokens}-token query and {o.items} items of {o.item_tokens} tokens, 3 labels; B "
        f"requests with distinct queries per step (`score_batch`), median of {o.repeats} runs "
        "once every signature is compiled"
        + (" (--tiny: a smoke run, not a result)" if o.tiny else ""),
        "engine settings are the shipped GPU config's (`serve_config.gpu.yaml`: bfloat16, batches "
        "up to 64, single-item steps of 64 x 2048 tokens) with the query cache off; with "
        "`attention: auto` the causal rows (prefix steps, single-item rows) run cuDNN flash "
        "attention; the XLA columns run the same engines with `attention: xla`",
        "transformers: `Qwen3ForCausalLM` with the same weights, bf16, batched `query + item` "
        f"rows, `logits_to_keep=1`; peak: XLA bf16 matmul on random data, "
        f"{rows[0]['peak'] / 1e12:.0f} TFLOP/s; model FLOP/s count the useful work of each side "
        "(multi-item: query once; transformers: query per item)",
        "the differences are bf16 rounding (different summation order), not layout error: the "
        "float32 parity tests hold the layouts to 1e-5",
    )
    machine = f"{jax.devices()[0].device_kind} ({versions()})"
    title = "GPU engine, Qwen3-0.6B-shaped random weights in bf16"
    tables = [table(COLUMNS, [row_cells(r) for r in rows])]
    return [run.result(title, tables, key="gpu-tiny" if o.tiny else "gpu", machine=machine,
                       notes=notes)]  # fmt: skip


WORKLOAD = Workload(
    options=(
        Option("--batches", "1,2,4,8,16,32,64"), Option("--items", 10),
        Option("--query-tokens", 300), Option("--item-tokens", 10), Option("--repeats", 10),
        Option("--single-max-batch", 64), Option("--tiny", False, "tiny shape: a CPU smoke run"),
    ),
    measure=measure,
)  # fmt: skip
