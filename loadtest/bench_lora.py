"""LoRA benchmark: RFC-008's workload with 8 rank-16 adapters mixed in one step (semantics 21).

B requests per step (a 300-token query and 10 items of 10 tokens each), on a Qwen3-0.6B-shaped
model with random weights and 8 (``--adapters``) random rank-16 adapters on every projection,
written in PEFT's file layout (no peft needed): items/s of

- ``base``: the same requests on an engine without adapter slots (``max_loras: 0``);
- ``mixed``: the requests spread over the adapters, in one ``score_batch`` call, with the
  update in each form side by side (``dense``: every slot's update on every token;
  ``grouped``: tokens sorted by slot, each multiplying only its own; model.lora);
- ``one adapter a step``: the same requests, one call per adapter on the shipped form
  (``auto``; what an engine that cannot mix adapters does when requests arrive interleaved).

Engine only (no HTTP), the shipped settings of the machine's kind (``serve_config.gpu.yaml`` on a
GPU, ``serve_config.yaml`` on a CPU), medians of ``--repeats`` rounds (each runs every call
once in turn, so a drifting machine slows them alike) once every signature is compiled.
Targets (docs/benchmarks.md, "LoRA"): mixed >= 0.8x base, >= 3x one adapter a step::

    python -m loadtest.bench_lora [--batches 8,64] [--adapters 8] [--shape qwen3-0.6b|small]
        [--output FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from functools import partial
from pathlib import Path

import jax
import numpy as np

from cluster.mesh import build_mesh
from loadtest.bench_common import machine_description, timed_together, write_section
from loadtest.bench_engine import SERVE_CONFIG, make_work, shipped_settings
from loadtest.bench_gpu import QWEN3_0_6B, save_random_qwen3
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.lora import update_form

RANK = 16
FORMS = ("dense", "grouped")
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
SECTION = "## LoRA: {} rank-16 adapters mixed in one step"


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
    """The base engine (no slots) and one engine per form of the update, over the same
    weights and adapters."""
    gpu = jax.devices()[0].platform == "gpu"
    config = SERVE_CONFIG.parent / "serve_config.gpu.yaml" if gpu else SERVE_CONFIG
    settings = shipped_settings(config).replace(model=str(directory))
    mesh = build_mesh(settings.placement.mesh_shape)
    loaded = load_model(settings.model.name, mesh, settings.model.dtype)
    slots = settings.replace(
        max_loras=len(adapters),
        max_lora_rank=RANK,
        lora_adapters=tuple((f"a{i}", str(path)) for i, path in enumerate(adapters)),
    )
    built = {"base": ScoringEngine(loaded.model, loaded.params, mesh, settings, "qwen3-random")}
    for form in FORMS:
        model = dataclasses.replace(loaded.model, lora_update=form)
        built[form] = ScoringEngine(model, loaded.params, mesh, slots, "qwen3-random")
    built["shipped"] = built[update_form("auto", len(adapters) + 1)]
    return built


def one_batch(engines: dict[str, ScoringEngine], works: list[ScoreWork], repeats: int) -> dict:
    base, shipped = engines["base"], engines["shipped"]
    count = len(engines["dense"].info.adapters)
    mixed = [dataclasses.replace(w, adapter=f"a{i % count}") for i, w in enumerate(works)]
    groups = [[w for w in mixed if w.adapter == f"a{a}"] for a in range(count)]
    groups = [group for group in groups if group]

    def each_alone() -> list[np.ndarray]:
        return [answer for group in groups for answer in shipped.score_batch(group)]

    calls = {
        "base": lambda: base.score_batch(works),
        **{form: partial(engines[form].score_batch, mixed) for form in FORMS},
        "alone": each_alone,
    }
    for call in calls.values():  # twice: a covered shape compiles once it recurs
        call(), call()
    for name in ("base", *FORMS):
        engines[name].wait_for_background_compiles()
    seconds = timed_together(calls, repeats)
    together = np.concatenate(shipped.score_batch(mixed))
    alone = dict(zip((id(w) for g in groups for w in g), each_alone(), strict=True))
    separate = np.concatenate([alone[id(w)] for w in mixed])
    items = sum(w.num_items for w in works)
    grouped = np.concatenate(engines["grouped"].score_batch(mixed))
    dense = np.concatenate(engines["dense"].score_batch(mixed))
    return {
        "batch": len(works),
        "items": items,
        "shipped": update_form("auto", count + 1),
        **{f"{name}_items_per_s": items / s for name, s in seconds.items()},
        "diff_mixed_alone": float(np.abs(together - separate).max()),
        "diff_grouped_dense": float(np.abs(grouped - dense).max()),
    }


def format_row(r: dict) -> str:
    base, dense, grouped, alone = (
        r[f"{n}_items_per_s"] for n in ("base", "dense", "grouped", "alone")
    )
    mixed = r[f"{r['shipped']}_items_per_s"]
    cells = [r["batch"], r["items"], r["shipped"], f"{base:.0f}", f"{dense:.0f}"]
    cells += [f"{grouped:.0f}", f"{alone:.0f}", f"{dense / base:.2f}x", f"{grouped / base:.2f}x"]
    cells += [f"{mixed / alone:.2f}x", f"{r['diff_mixed_alone']:.1e}"]
    cells += [f"{r['diff_grouped_dense']:.1e}"]
    return "| " + " | ".join(map(str, cells)) + " |"


HEADER = (
    "| requests per step | items | shipped form | base items/s | mixed, dense items/s "
    "| mixed, grouped items/s | one adapter a step items/s | dense / base | grouped / base "
    "| shipped mixed / one a step | max abs diff mixed vs alone | max abs diff grouped vs dense "
    "|\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--shape", choices=("qwen3-0.6b", "small"), default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args()
    shape = QWEN3_0_6B if args.shape == "qwen3-0.6b" else SMALL
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    with tempfile.TemporaryDirectory() as tmp:
        save_random_qwen3(Path(tmp) / "base", shape)
        paths = [save_random_adapter(Path(tmp) / f"a{i}", shape, i) for i in range(args.adapters)]
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
        f"`python -m loadtest.bench_lora --shape {args.shape} --batches {args.batches} "
        f"--adapters {args.adapters}` on {where} ({args.shape}, random weights, "
        f"{args.adapters} random rank-16 adapters on every projection; the shipped settings "
        f"of the machine's kind; medians of {args.repeats} rounds, each running every "
        "call once in turn, once every signature is compiled). Mixed: the requests spread "
        "over the adapters in one call, the update "
        "dense (every slot on every token) and grouped (tokens sorted by slot) side by side; "
        "the shipped form is what `auto` picks for this many slots. One adapter a step: the "
        "same requests, one call per adapter, on the shipped form. Targets: mixed >= 0.8x "
        "base, >= 3x one adapter a step.",
        "",
        HEADER,
        *(format_row(r) for r in rows),
    ]
    title = f"{SECTION.format(args.adapters)} ({device.platform})"
    write_section(Path(args.output), title, "\n".join(lines))


if __name__ == "__main__":
    main()
