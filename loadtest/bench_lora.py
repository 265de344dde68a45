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

    python -m loadtest run lora [--batches 8,64] [--adapters 8] [--shape qwen3-0.6b|small]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from functools import partial
from pathlib import Path

import jax
import numpy as np

from loadtest import bench_common as common
from loadtest.bench_gpu import QWEN3_0_6B
from loadtest.harness import (
    Option,
    Result,
    Run,
    Workload,
    col,
    counts,
    machine_description,
    table,
    timed_together,
)
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
    config = common.GPU_CONFIG if gpu else common.SERVE_CONFIG
    settings = common.shipped_settings(config).replace(model=str(directory))
    built, loaded = common.build_engines(settings, {"base": settings}, "qwen3-random")
    mesh = loaded.params["embed"].sharding.mesh
    slots = settings.replace(
        max_loras=len(adapters),
        max_lora_rank=RANK,
        lora_adapters=tuple((f"a{i}", str(path)) for i, path in enumerate(adapters)),
    )
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


COLUMNS = (
    col("requests per step", "d"), col("items", "d"), col("shipped form", left=True),
    col("base items/s", ".0f"), col("mixed, dense items/s", ".0f"),
    col("mixed, grouped items/s", ".0f"), col("one adapter a step items/s", ".0f"),
    col("dense / base", ".2f", "x"), col("grouped / base", ".2f", "x"),
    col("shipped mixed / one a step", ".2f", "x"), col("max abs diff mixed vs alone", ".1e"),
    col("max abs diff grouped vs dense", ".1e"),
)  # fmt: skip


def row_cells(r: dict) -> tuple:
    base, dense, grouped, alone = (r[f"{n}_items_per_s"] for n in ("base", *FORMS, "alone"))
    mixed = r[f"{r['shipped']}_items_per_s"]
    diffs = r["diff_mixed_alone"], r["diff_grouped_dense"]
    return (r["batch"], r["items"], r["shipped"], base, dense, grouped, alone, dense / base,
            grouped / base, mixed / alone, *diffs)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    shape = QWEN3_0_6B if o.shape == "qwen3-0.6b" else SMALL
    with tempfile.TemporaryDirectory() as tmp:
        common.random_checkpoint(Path(tmp) / "base", shape, "bfloat16")
        paths = [save_random_adapter(Path(tmp) / f"a{i}", shape, i) for i in range(o.adapters)]
        built = engines(Path(tmp) / "base", paths)
    rows = []
    for batch in counts(o.batches):
        works = [common.make_work(10, 300, 10, seed=s) for s in range(batch)]
        rows.append(one_batch(built, works, o.repeats))
        run.say(str(row_cells(rows[-1])))
    device = jax.devices()[0]
    notes = (
        f"{o.shape}, random weights, {o.adapters} random rank-16 adapters on every projection; "
        f"the shipped settings of the machine's kind; medians of {o.repeats} rounds, each "
        "running every call once in turn, once every signature is compiled",
        "mixed: the requests spread over the adapters in one call, the update dense (every slot "
        "on every token) and grouped (tokens sorted by slot) side by side; the shipped form is "
        "what `auto` picks for this many slots; one adapter a step: the same requests, one call "
        "per adapter, on the shipped form",
        "targets: mixed >= 0.8x base, >= 3x one adapter a step",
    )
    title = f"LoRA: {o.adapters} rank-16 adapters mixed in one step ({device.platform})"
    machine = device.device_kind if device.platform == "gpu" else machine_description()
    key = f"lora-{device.platform}-{o.adapters}"
    tables = [table(COLUMNS, [row_cells(r) for r in rows])]
    return [run.result(title, tables, key=key, machine=machine, notes=notes)]


WORKLOAD = Workload(
    options=(
        Option("--batches", "8,64"), Option("--adapters", 8),
        Option("--shape", "qwen3-0.6b", choices=("qwen3-0.6b", "small")), Option("--repeats", 5),
    ),
    measure=measure,
)  # fmt: skip
