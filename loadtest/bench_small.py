"""Benchmark: what a small request costs, where a step's time goes on this CPU, and peers.

    python -m loadtest run small [--url http://127.0.0.1:8000] [--repeats 10] [--no-steps]

All in this process, on the shipped serve_config.yaml's settings (SmolLM2-135M-Instruct in
float32) unless said otherwise; every time a median of ``--repeats`` after a warm-up call:

1. Step cost against tokens: fused steps of 16 to 256 tokens and prefix steps; a
   least-squares line ``seconds = fixed + per_token x tokens``; what fused rows' width costs
   a burst.
2. The floor of a step: the weights' bytes (every pass reads them all once) over this
   machine's read bandwidth (a float32 sum over 1 GiB); and the parts of the fixed cost: a
   jitted no-op (XLA's dispatch), the host's own work (the step less its executable run on
   arguments already placed), the LM head's matmul alone, every layer's matmuls alone (over
   the scanned stack as the model runs them, and over per-layer arrays), and a step after
   0.2 s idle (the thread pool parked, caches cold).
3. A 9-token query with 2 items (``""``, ``" not"``) and 3 labels, the same token ids
   everywhere: the engine, transformers (a forward per row; both rows in one padded
   forward), llama.cpp on the same GGUF (a row per item; the query once, its KV cache kept)
   when llama-cpp-python is installed; their log-probs compared. With ``--url`` (a running
   ``make serve``) the same request over HTTP.
4. Multi-item against llama.cpp keeping the query's KV cache: a 300-token query with 10 and
   100 items of 10 tokens.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import numpy as np

from loadtest import peers
from loadtest.bench_common import compiled, make_work, shipped_settings
from loadtest.bench_small_report import report, step_tables
from loadtest.harness import LABELS, Option, Result, Run, Workload, counts, timed, timed_together

QUERY = "Is Paris the capital of France? Answer:"  # 9 tokens (SmolLM2 adds no BOS)
ITEMS = ["", " not"]


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Best bytes/s of summing a ``gib`` GiB float32 array (reads it once)."""
    data = np.ones(int(gib * 2**30) // 4, np.float32)
    return data.nbytes / timed_together({"sum": data.sum}, repeats, warm=0).best("sum")


def engine_for(loaded: Any, settings: Any) -> Any:
    from replicas.engine.scoring_engine import ScoringEngine

    mesh = loaded.params["embed"].sharding.mesh
    return ScoringEngine(loaded.model, loaded.params, mesh, settings, settings.model.name)


def step_costs(loaded: Any, settings: Any, repeats: int) -> dict[str, Any]:
    """Median seconds of fused and prefix steps of several widths and the fitted line."""
    from replicas.contract import ScoreWork

    engine = engine_for(loaded, settings)
    rows = []
    for width in (16, 32, 64, 128, 256):  # one work filling a fused row exactly
        work = ScoreWork((100,) * (width - 2), ((200,), (300,)), LABELS)
        seconds = timed(lambda w=work: engine.score_batch([w]), repeats)
        rows.append({"step": "fused", "tokens": width, "seconds": seconds})
    no_fuse = engine_for(loaded, settings.replace(fused_step_tokens=0, query_cache_bytes=0))
    for width in (16, 64, 256):  # a prefix step, then a 16-token item step, per request
        work = ScoreWork((100,) * width, ((200,),), LABELS)
        seconds = timed(lambda w=work: no_fuse.score_batch([w]), repeats)
        rows.append({"step": "prefix + items", "tokens": width + 16, "seconds": seconds})
    fused = [r for r in rows if r["step"] == "fused"]
    slope, fixed = np.polyfit([r["tokens"] for r in fused], [r["seconds"] for r in fused], 1)
    wide = engine_for(loaded, settings.replace(fused_step_tokens=1024, query_cache_bytes=0))
    return {
        "rows": rows,
        "row_widths": row_widths(wide, repeats),
        "fixed_s": float(fixed),
        "per_token_s": float(slope),
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


def layer_matrices(params: Any, hidden: int) -> list[Any]:
    """Every stacked layer weight as ``[layers, in, out]`` (in: the leading axes whose product
    first reaches ``hidden``): the matmuls a layer runs, without attention or norms."""
    import jax

    out = []
    for leaf in jax.tree.leaves(params["layers"]):
        if leaf.ndim < 3:
            continue  # norms
        sizes = np.cumprod(leaf.shape[1:])
        split = int(np.argmax(sizes >= hidden)) + 2
        out.append(leaf.reshape(leaf.shape[0], int(np.prod(leaf.shape[1:split])), -1))
    return out


def floor_parts(engine: Any, loaded: Any, work: Any, repeats: int) -> dict[str, Any]:
    """The floor of a pass and what ``work``'s (a small fused step's) fixed cost is made of."""
    import jax
    import jax.numpy as jnp

    from replicas.engine.scoring_engine import place

    params = loaded.params
    calls: list[tuple] = []
    run_device = engine.run_device
    engine.run_device = lambda *call: calls.append(call) or run_device(*call)
    step = partial(engine.score_batch, [work])
    step_s = timed(step, repeats)
    del engine.run_device  # the method again
    kind, dims, args = calls[-1]
    executable = engine.executables()[(kind, dims)]
    (_, *shardings), _ = executable.input_shardings
    placed = jax.tree.map(
        partial(place, fallback=engine.placement.replicated), args, tuple(shardings)
    )
    run_s = timed(lambda: executable(engine.params, *placed).block_until_ready(), repeats)

    noop = jax.jit(lambda x: x + 1)
    scalar = jnp.zeros((), jnp.int32)
    embed = params["embed"]
    head = jax.jit(lambda h, e: jnp.einsum("nd,vd->nv", h, e))
    two = jnp.ones((2, embed.shape[1]), jnp.float32)
    stacked = layer_matrices(params, embed.shape[1])
    tokens = dims.rows * dims.tokens
    x = jnp.ones((tokens, max(w.shape[1] for w in stacked)), jnp.float32)

    def total(ws: Any) -> Any:
        return sum(jnp.sum(x[:, : w.shape[0]] @ w) for w in ws)

    scanned = jax.jit(lambda ws: jax.lax.scan(lambda t, w: (t + total(w), None), 0.0, ws)[0])
    split = [[w[layer] for w in stacked] for layer in range(stacked[0].shape[0])]
    unstacked = jax.jit(lambda per_layer: sum(total(ws) for ws in per_layer))
    weight_bytes = sum(int(leaf.nbytes) for leaf in jax.tree.leaves(params))
    bandwidth = read_bandwidth()
    return {
        "tokens": tokens,
        "step_s": step_s,
        "run_s": run_s,
        "idle_step_s": timed_together({"idle": step}, repeats, pause_s=0.2)["idle"],
        "noop_s": timed(lambda: noop(scalar).block_until_ready(), 20 * repeats),
        "head_s": timed(lambda: head(two, embed).block_until_ready(), repeats),
        "head_bytes": int(embed.nbytes),
        "layers_scan_s": timed(lambda: scanned(stacked).block_until_ready(), repeats),
        "layers_split_s": timed(lambda: unstacked(split).block_until_ready(), repeats),
        "layer_bytes": sum(int(w.nbytes) for w in stacked),
        "weight_bytes": weight_bytes,
        "bandwidth": bandwidth,
        "floor_s": weight_bytes / bandwidth,
    }


def small_rows() -> tuple[list[int], list[list[int]]]:
    """The small request's token ids: the query, and each item's ids."""
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    tokenizer = load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct"))
    items = [tokenizer(item, add_special_tokens=False)["input_ids"] for item in ITEMS]
    return tokenizer(QUERY)["input_ids"], items


def small_peers(
    work: Any, engine: Any, hf: Any, llama: Any, repeats: int, served: Any = None
) -> dict[str, Any]:
    """The small request in this process: the engine, transformers and llama.cpp on the
    same token ids, and ``served`` (the request over HTTP) when given, every one once a round
    in a shuffled order; their times and the labels' log-probs each gives."""
    query, items = list(work.query_ids), [list(i) for i in work.item_ids]
    calls = {
        "engine": lambda: engine.score_batch([work])[0],
        "hf_rows": peers.hf_rows(hf, work),
        "hf_batched": peers.hf_padded(hf, work),
    }
    if llama is not None:
        calls["llama_rows"] = lambda: llama.rows(query, items)
        calls["llama_shared"] = lambda: llama.shared(query, items)
    if served is not None:
        calls["served"] = served
    timings = timed_together(calls, repeats, warm=2, shuffle=True)
    kept = {"engine": "engine", "hf": "hf_rows", "llama": "llama_shared"}
    kept["llama_rows"] = "llama_rows"
    logprobs = {k: timings.last[name] for k, name in kept.items() if name in calls}
    return {"query_tokens": len(query), "times": dict(timings), "logprobs": logprobs}


def multi_items(engine: Any, llama: Any, counts: tuple[int, ...], repeats: int) -> list[dict]:
    """A 300-token query with ``counts`` items of 10 tokens: the engine (shared prefix)
    against llama.cpp keeping the query's KV cache across items."""
    out = []
    for count in counts:
        work = make_work(count, 300, 10)
        row = {"items": count, "engine_s": timed(compiled(engine, [work]), repeats)}
        if llama is not None:
            query, items = list(work.query_ids), [list(i) for i in work.item_ids]
            row["llama_s"] = timed(lambda q=query, i=items: llama.shared(q, i), repeats)
            mine = engine.score_batch([work])[0]
            row["max_diff"] = float(np.abs(mine - llama.shared(query, items)).max())
        out.append(row)
    return out


def http_small(client: Any) -> Any:
    """The small request over HTTP, through ``client`` (an ``httpx.Client`` at the server)."""
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": list(LABELS)}
    return lambda: client.post("/v1/score", json=body).raise_for_status()


def shipped_small() -> tuple[Any, Any, Any]:
    """(settings, loaded model, the small request's ScoreWork) on the shipped config, with
    background compiles off so timings see none."""
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model
    from replicas.contract import ScoreWork

    settings = shipped_settings().replace(background_compile=False)
    loaded = load_model(
        settings.model.name, build_mesh(settings.placement.mesh_shape), settings.model.dtype
    )
    query, items = small_rows()
    return settings, loaded, ScoreWork(tuple(query), tuple(map(tuple, items)), LABELS)


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    import httpx

    settings, loaded, work = shipped_small()
    llama = peers.llama_cpp()
    engine = engine_for(loaded, settings)
    run.say("the small request")
    with httpx.Client(base_url=o.url or "http://unused", timeout=60) as client:
        served = http_small(client) if o.url else None
        small = small_peers(work, engine, peers.load_hf_model(), llama, o.repeats, served)
    results = {
        "served_s": small["times"].pop("served", None),
        "llama": llama is not None,
        "small": small,
        "multi": multi_items(engine, llama, tuple(counts(o.items)), o.multi_repeats),
        "floor": floor_parts(engine, loaded, work, o.repeats),
        "costs": None if not o.steps else step_costs(loaded, settings, o.repeats),
    }
    notes, tables = report(results, o)
    small = run.result("Small requests: one weight pass", tables, notes=notes)
    if results["costs"] is None:  # --no-steps: the stored step tables stay the current ones
        return [small]
    title = "Small requests: step cost against tokens"
    return [small, run.result(title, step_tables(results["costs"]), key="small-steps")]


WORKLOAD = Workload(
    url=True,
    options=(
        Option("--repeats", 10), Option("--multi-repeats", 3),
        Option("--items", "10,100", "multi-item counts"),
        Option("--no-steps", True, "skip the step-cost tables"),
    ),
    measure=measure,
)  # fmt: skip
