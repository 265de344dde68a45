"""Projections of a workload on a TPU slice from the steps XLA compiled for it.

Each step the workload runs is compiled for the slice (deviceless) as served, for the bytes
its arguments, outputs and temporaries move, and again with no layers: the two compiles'
difference is one layer's per-chip FLOPs and collective bytes (``planning.compiled_cost``). A
step's time is ``max(FLOPs / peak, bytes / HBM bandwidth) + collective bytes / ICI
bandwidth`` per chip: a bound from published chip figures, not a measurement; it leaves out
kernel efficiency, host overhead and batching delays. The analytic FLOPs below are the
independent reference the tests hold the compiled counts to.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from cluster.tpu_topology import ChipSpec
from planning.compile_times import CompileTimes
from planning.compiled_cost import ChipCost, every_layer, executable_cost
from replicas.model.config import ModelConfig
from replicas.model.flops import lm_head_flops, matmul_params_per_token

WORKLOAD = (300, 10, 10, 2)  # RFC-008: query tokens, items, item tokens, labels
RANKING = (300, 1000, 10, 2)  # one request of 1000 candidates behind RFC-008's query


def attention_flops(c: ModelConfig, tokens: int, keys: int) -> int:
    """QK^T and PV of ``tokens`` queries over ``keys`` keys, every layer."""
    return 4 * tokens * keys * c.num_heads * c.head_dim * c.num_layers


def step_flops(c: ModelConfig, kind: str, dims: Any, rows: int) -> int:
    """Padded FLOPs of one step as compiled: prefix (B, T) dense, items (B, T, S, W) with
    the prefix part over T and the own-item part over 2W keys, rows (R, L) dense; plus the
    LM head over ``rows`` scored rows."""
    dense = 2 * matmul_params_per_token(c)
    if kind == "embed":  # B rows of T tokens, each over at most W keys of its own sequence
        tokens = dims.batch * dims.tokens
        return tokens * dense + attention_flops(c, tokens, dims.window)
    if kind == "prefix":
        tokens = dims.batch * dims.tokens
        return tokens * dense + attention_flops(c, tokens, dims.tokens)
    if kind == "items":
        tokens = dims.batch * dims.tokens
        keys = dims.prefix + 2 * dims.window
        return tokens * dense + attention_flops(c, tokens, keys) + rows * lm_head_flops(c)
    tokens = dims.rows * dims.tokens
    return tokens * dense + attention_flops(c, tokens, dims.tokens) + rows * lm_head_flops(c)


def bare_engine(engine: Any, mesh: Any, abstract_params: Any) -> Any:
    """The engine's layouts and settings on the same model with no layers (the embedding,
    final norm and heads, sharded alike): what a step costs besides its layers."""
    from replicas.engine.scoring_engine import ScoringEngine

    model = dataclasses.replace(engine.model, config=engine.model.config.with_layers(0))
    params, _ = abstract_params(model, mesh)
    return ScoringEngine(model, params, mesh, engine.settings, "no layers")


def step_cost(bare: Any, serving: Any, key: tuple[str, Any], times: CompileTimes) -> ChipCost:
    """Per-chip cost of the step ``key`` with every layer: FLOPs and collectives from the
    served compile and the one with no layers, bytes from the served executable."""
    times.compile(serving, [key], "bytes")
    times.compile(bare, [key], "cost no layers")
    served = executable_cost(serving.executables()[key])
    without = executable_cost(bare.executables()[key])
    c = serving.model.config
    return every_layer(served, without, c.num_layers, int8_share(c, *key))


INT8_DOTS = ("int8", "int8_smooth")  # W8A8: the projections compile to s8 x s8 -> s32


def int8_share(c: ModelConfig, kind: str, dims: Any) -> float:
    """The part of a layer's FLOPs in step ``kind`` its seven projections are, when they run
    as int8 dots (docs/tpu.md: the compiled HLO's s32 convolutions of s8 operands); 0 else.
    Analytic, from ``step_flops`` without the LM head: XLA's count has no per-dtype split."""
    if c.quantization not in INT8_DOTS:
        return 0.0
    tokens = dims.rows * dims.tokens if kind == "rows" else dims.batch * dims.tokens
    return tokens * 2 * matmul_params_per_token(c) / step_flops(c, kind, dims, 0)


def step_row(key: tuple[str, Any], cost: ChipCost, chip: ChipSpec, runs: int) -> dict[str, Any]:
    kind, dims = key
    return {
        "kind": kind,
        "dims": list(dims.astuple()),
        "runs": runs,
        "ms": round(cost.seconds(chip) * 1e3, 4),
        "flops_per_chip": cost.flops,
        "hbm_bytes_per_chip": cost.hbm_bytes,
        "ici_bytes_per_chip": cost.ici_bytes,
        "collective_ms": round(cost.collective_seconds(chip) * 1e3, 4),
    }


def workload_steps(engine: Any, shape: tuple[int, int, int, int], batch: int) -> Counter:
    """The steps ``batch`` requests of ``shape`` (distinct queries, query first) run on the
    shared-prefix path: the item-stream steps the engine plans, and the prefix steps that
    compute their queries, batched as the layout batches them."""
    from replicas.contract import ScoreWork
    from replicas.engine.layouts.common import bucket_for, data_buckets
    from replicas.engine.layouts.shared_prefix import PrefixDims

    query, items, item_tokens, labels = shape
    token = 2 if engine.settings.model.multi_item_scoring_delimiter == 1 else 1
    work = ScoreWork((token,) * query, ((token,) * item_tokens,) * items, tuple(range(labels)))
    runs = Counter(key for key in engine.plan([work] * batch) if key[0] == "items")
    buckets = data_buckets(engine.settings.engine.batch_buckets, engine.placement.groups)
    width = next(iter(runs))[1].prefix
    for start in range(0, batch, buckets[-1]):
        queries = min(buckets[-1], batch - start)
        runs[("prefix", PrefixDims(bucket_for(queries, buckets, "batch_buckets"), width))] += 1
    return runs


def project_workload(
    bare: Any,
    engine: Any,
    chip: ChipSpec,
    shape: tuple[int, int, int, int],
    batch: int,
    times: CompileTimes | None = None,
) -> dict[str, Any]:
    """``batch`` concurrent requests of ``shape``: every step they run, cold and cached."""
    runs = workload_steps(engine, shape, batch)
    times = times or CompileTimes(echo=None)
    costs = {key: step_cost(bare, engine, key, times) for key in runs}
    seconds = sum(costs[key].seconds(chip) * n for key, n in runs.items())
    warm = sum(costs[key].seconds(chip) * n for key, n in runs.items() if key[0] != "prefix")
    items = shape[1] * batch
    return {
        "kind": "score",
        "shape": list(shape),
        "batch": batch,
        "steps": [step_row(key, costs[key], chip, n) for key, n in runs.items()],
        "latency_s": seconds,
        "items_per_s": round(items / seconds, 1),
        "items_per_s_cached_query": round(items / warm, 1),
    }


WORKLOADS = ("single", "batched", "ranking")  # the rows ``project`` can make, in its order


def project(
    engine: Any,
    mesh: Any,
    chip: ChipSpec,
    abstract_params: Any,
    times: CompileTimes,
    workloads: tuple[str, ...] = WORKLOADS,
    batched: int | None = None,
) -> list[dict]:
    """The ``workloads`` rows: RFC-008's workload at 1 request per step (``single``) and at
    the largest batch bucket or ``batched`` requests (``batched``), and one request of 1000
    items (``ranking``, a ranking request's latency). Each row compiles its own steps, and
    again with no layers."""
    bare = bare_engine(engine, mesh, abstract_params)
    many = batched or engine.settings.engine.batch_buckets[-1]
    shapes = {"single": (WORKLOAD, 1), "batched": (WORKLOAD, many), "ranking": (RANKING, 1)}
    chosen = list(dict.fromkeys(shapes[w] for w in WORKLOADS if w in workloads))
    return [project_workload(bare, engine, chip, shape, b, times) for shape, b in chosen]


def project_embed(
    engine: Any, mesh: Any, chip: ChipSpec, abstract_params: Any, times: CompileTimes
) -> list[dict]:
    """An embedder's or cross-encoder's steps (every one an ``embed`` step): one full row
    (a latency) and the fullest step (the largest batch bucket of full rows: throughput).
    Tokens/s count the step's stream tokens as real: the packer's padding (computed / real
    tokens, docs/benchmarks.md) divides it."""
    bare = bare_engine(engine, mesh, abstract_params)
    keys = [key for key in engine.warmup_keys() if key[0] == "embed"]
    widest = max(key[1].tokens for key in keys)
    full = [key for key in keys if key[1].tokens == widest]
    rows = []
    for key in sorted({min(full, key=_batch), max(full, key=_batch)}, key=_batch):
        cost = step_cost(bare, engine, key, times)
        tokens, seconds = key[1].batch * key[1].tokens, cost.seconds(chip)
        rows.append({
            "kind": "embed", "tokens": tokens, "latency_s": seconds,
            "tokens_per_s": round(tokens / seconds, 1), "steps": [step_row(key, cost, chip, 1)],
        })  # fmt: skip
    return rows


def _batch(key: tuple[str, Any]) -> int:
    return key[1].batch
