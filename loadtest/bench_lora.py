"""LoRA benchmark: RFC-008's workload with 8 rank-16 adapters mixed in one step (semantics 21).

B requests per step (a 300-token query and 10 items of 10 tokens each), on a Qwen3-0.6B-shaped
model with random weights and 8 random rank-16 adapters on every projection, written in
PEFT's file layout (no peft needed): items/s of

- ``base``: the same requests on an engine without adapter slots (``max_loras: 0``);
- ``mixed``: the requests spread over the 8 adapters, in one ``score_batch`` call;
- ``one adapter a step``: the same requests, one call per adapter (what an engine that cannot
  mix adapters does when requests arrive interleaved).

Engine only (no HTTP), the shipped settings of the machine's kind (``serve_config.gpu.yaml`` on a
GPU, ``serve_config.yaml`` on a CPU), medians of ``--repeats`` once every signature is
compiled. Targets (DESIGN.md): mixed >= 0.8x base, >= 3x one adapter a step::

    python -m loadtest.bench_lora [--batches 8,64] [--shape qwen3-0.6b|small] [--output FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from pathlib import Path

import jax
import numpy as np

from cluster.mesh import build_mesh
from loadtest.bench_common import machine_description, timed, write_section
from loadtest.bench_engine import SERVE_CONFIG, make_work, shipped_settings
from loadtest.bench_gpu import QWEN3_0_6B, save_random_qwen3
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine

ADAPTERS, RANK = 8, 16
# A CPU-sized shape of the same family (4 layers of Qwen3-0.6B's width): the 28-layer model
# takes minutes a step on 2 cores.
SMALL = {**QWEN3_0_6B, "num_hidden_layers": 4}
MODULES = {  # PEFT module -> (its block, in features, out features) from a config
    "q_proj": ("self_attn", "d", "q"),
    "k_proj": ("self_attn", "d", "kv"),
    "v_proj": ("self_attn", "d", "kv"),
    "o_proj": ("self_attn", "q", "d"),
    "gate_proj": ("mlp", "d", "f"),
    "up_proj": ("mlp", "d", "f"),
    "down_proj": ("mlp", "f", "d"),
}
SECTION = "## LoRA: 8 rank-16 adapters mixed in one step"


def save_random_adapter(directory: Path, shape: dict, seed: int) -> Path:
    """A rank-16 LoRA on every projection with random A and B, as PEFT saves one."""
    from safetensors.numpy import save_file

    head_dim = shape["head_dim"]
    sizes = {
        "d": shape["hidden_size"],
        "q": shape["num_attention_heads"] * head_dim,
        "kv": shape["num_key_value_heads"] * head_dim,
        "f": shape["intermediate_size"],
    }
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(shape["num_hidden_layers"]):
        for module, (block, fan_in, fan_out) in MODULES.items():
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            a = rng.normal(0, 0.02, (RANK, sizes[fan_in]))
            tensors[f"{key}.lora_A.weight"] = a.astype(np.float32)
            b = rng.normal(0, 0.02, (sizes[fan_out], RANK))
            tensors[f"{key}.lora_B.weight"] = b.astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": 2 * RANK}
    config["target_modules"] = list(MODULES)
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def engines(directory: Path, adapters: list[Path]) -> dict[str, ScoringEngine]:
    gpu = jax.devices()[0].platform == "gpu"
    config = SERVE_CONFIG.parent / "serve_config.gpu.yaml" if gpu else SERVE_CONFIG
    settings = shipped_settings(config).replace(model=str(directory))
    mesh = build_mesh(settings.mesh_shape)
    loaded = load_model(settings.model, mesh, settings.dtype)
    slots = settings.replace(
        max_loras=ADAPTERS,
        max_lora_rank=RANK,
        lora_adapters=tuple((f"a{i}", str(path)) for i, path in enumerate(adapters)),
    )
    return {
        name: ScoringEngine(loaded.model, loaded.params, mesh, s, "qwen3-random")
        for name, s in (("base", settings), ("lora", slots))
    }


def one_batch(engines: dict[str, ScoringEngine], works: list[ScoreWork], repeats: int) -> dict:
    base, lora = engines["base"], engines["lora"]
    mixed = [dataclasses.replace(w, adapter=f"a{i % ADAPTERS}") for i, w in enumerate(works)]
    groups = [[w for w in mixed if w.adapter == f"a{a}"] for a in range(ADAPTERS)]
    groups = [group for group in groups if group]

    def each_alone() -> list[np.ndarray]:
        return [answer for group in groups for answer in lora.score_batch(group)]

    calls = {
        "base": lambda: base.score_batch(works),
        "mixed": lambda: lora.score_batch(mixed),
        "alone": each_alone,
    }
    for call in calls.values():  # twice: a covered shape compiles once it recurs
        call(), call()
    for engine in (base, lora):
        engine.wait_for_background_compiles()
    seconds = {name: timed(call, repeats) for name, call in calls.items()}
    together = np.concatenate(lora.score_batch(mixed))
    alone = dict(zip((id(w) for g in groups for w in g), each_alone(), strict=True))
    separate = np.concatenate([alone[id(w)] for w in mixed])
    items = sum(w.num_items for w in works)
    return {
        "batch": len(works),
        "items": items,
        **{f"{name}_items_per_s": items / s for name, s in seconds.items()},
        "diff_mixed_alone": float(np.abs(together - separate).max()),
    }


def format_row(r: dict) -> str:
    base, mixed, alone = (r[f"{n}_items_per_s"] for n in ("base", "mixed", "alone"))
    cells = [r["batch"], r["items"], f"{base:.0f}", f"{mixed:.0f}", f"{alone:.0f}"]
    cells += [f"{mixed / base:.2f}x", f"{mixed / alone:.2f}x", f"{r['diff_mixed_alone']:.1e}"]
    return "| " + " | ".join(map(str, cells)) + " |"


HEADER = (
    "| requests per step | items | base items/s | mixed 8 adapters items/s "
    "| one adapter a step items/s | mixed / base | mixed / one a step "
    "| max abs diff mixed vs alone |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--shape", choices=("qwen3-0.6b", "small"), default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    shape = QWEN3_0_6B if args.shape == "qwen3-0.6b" else SMALL
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    with tempfile.TemporaryDirectory() as tmp:
        save_random_qwen3(Path(tmp) / "base", shape)
        paths = [save_random_adapter(Path(tmp) / f"a{i}", shape, i) for i in range(ADAPTERS)]
        built = engines(Path(tmp) / "base", paths)
    print(HEADER, flush=True)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        works = [make_work(10, 300, 10, seed=s) for s in range(batch)]
        rows.append(one_batch(built, works, args.repeats))
        print(format_row(rows[-1]), flush=True)
        if out:
            (out / "bench_lora.json").write_text(json.dumps(rows, indent=1))
    device = jax.devices()[0]
    where = device.device_kind if device.platform == "gpu" else machine_description()
    lines = [
        f"`python -m loadtest.bench_lora --shape {args.shape} --batches {args.batches}` on "
        f"{where} ({args.shape}, random weights, 8 random rank-16 adapters on every "
        "projection; the shipped settings of the machine's kind; medians of "
        f"{args.repeats} once every signature is compiled). Mixed: the requests spread over "
        "the adapters in one call; one adapter a step: the same requests, one call per "
        "adapter. Targets: mixed >= 0.8x base, >= 3x one adapter a step.",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    write_section(Path(args.output), f"{SECTION} ({device.platform})", "\n".join(lines))


if __name__ == "__main__":
    main()
