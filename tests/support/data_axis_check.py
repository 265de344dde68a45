"""Run as ``python -m tests.support.data_axis_check DIR`` with 4 host devices (XLA_FLAGS set).

Scores the same works with every layout on meshes ``[1, 1]``, ``[2, 1]``, ``[1, 2]`` and
``[2, 2]`` (``[data, model]``), the query cache and a many-item request included, and reads
each compiled step's per-device FLOPs from XLA (``cost_analysis`` of the partitioned
executable). Prints one JSON line: per mesh and layout the scores, and per step signature
compiled on a mesh with ``data`` = 2 its FLOPs beside the same signature on the mesh with
``data`` = 1 and the same model axis. The XLA flag must be set before jax initializes,
hence a separate process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from replicas.contract import ScoreWork

MESHES = ((1, 1), (2, 1), (1, 2), (2, 2))
LAYOUTS: dict[str, dict[str, Any]] = {
    "shared_prefix": {"multi_item_scoring_delimiter": 3},
    "packed_reference": {"multi_item_scoring_delimiter": 3, "layout": "packed_reference"},
    "single_item": {"multi_item_scoring_delimiter": None},
}


def rounds(vocab: int) -> list[list[ScoreWork]]:
    """Four calls: a batch of requests of 1 to 40 items (an empty one too), one item-first;
    the same queries with fresh items (query cache hits); twice one request alone with 3
    items."""
    rng = np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(10, vocab, n))

    queries = [ids(20), ids(9), ids(31), ids(7)]
    labels = ((5, 7, 9), (4, 8), (11,))

    def batch() -> list[ScoreWork]:
        return [
            ScoreWork(queries[0], tuple(ids(n) for n in (5, 1, 7, 3)), labels[0]),
            ScoreWork(queries[1], tuple(ids(2 + i % 5) for i in range(40)), labels[1]),
            ScoreWork(queries[2], (ids(4),), labels[2]),
            ScoreWork(queries[3], (ids(2), ()), labels[1]),
            ScoreWork(ids(6), (ids(3), ids(5)), labels[0], item_first=True),
        ]

    def alone() -> list[ScoreWork]:  # one request, its items spread over every data shard
        return [ScoreWork(ids(12), (ids(2), ids(8), ids(1)), labels[0])]

    return [batch(), batch(), alone(), alone()]


def flops(compiled: Any) -> float:
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0))


def output_bytes(compiled: Any) -> int:
    return int(compiled.memory_analysis().output_size_in_bytes)


def cache_bytes_per_device(engine: Any) -> int:
    """The most prefix keys/values bytes the query cache holds on any one device."""
    per_device: dict[Any, int] = {}
    for copies in engine.cache.entries():
        for entry in copies.entries.values():
            for pieces in (entry.keys, entry.values):
                for device, piece in pieces.items():
                    per_device[device] = per_device.get(device, 0) + int(piece.nbytes)
    return max(per_device.values(), default=0)


def score_chunk_flops(loaded: Any, labels: int, compiled: Any) -> float:
    """Per-device FLOPs XLA counts for one chunk of the LM head loop of ``compiled`` (its
    ``score_chunk`` rows per data shard, from its output ``[G, Rg, C]``). XLA counts a loop
    body once, whatever its trip count (the real rows of the fullest shard, a run-time value
    that the data axis divides), so the comparison leaves this constant out of each side."""
    import jax
    import jax.numpy as jnp

    from replicas.engine.layouts.common import score_chunk

    scores = next(out for out in jax.tree.leaves(compiled.out_info) if len(out.shape) == 3)
    rows = score_chunk(scores.shape[1])
    mesh = loaded.params["embed"].sharding.mesh
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    width = loaded.config.hidden_size
    hidden = jax.ShapeDtypeStruct((rows, width), jnp.float32, sharding=whole)
    ids = jax.ShapeDtypeStruct((rows, labels), jnp.int32, sharding=whole)
    step = jax.jit(loaded.model.label_logprobs)
    return flops(step.lower(loaded.params, hidden, ids).compile())


def engine_for(loaded: Any, overrides: dict[str, Any]) -> Any:
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    base = {
        "batch_buckets": (1, 2, 4),
        "token_buckets": (16, 32, 64),
        "item_token_buckets": (16, 32, 64),
        "max_multi_item_seq_len": 256,
        "background_compile": False,
    }
    settings = ReplicaSettings.from_keys(**base | overrides)
    mesh = loaded.params["embed"].sharding.mesh
    return ScoringEngine(loaded.model, loaded.params, mesh, settings, "tiny")


def run(directory: Path) -> dict[str, Any]:
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model

    loaded = {mesh: load_model(directory, build_mesh(mesh)) for mesh in MESHES}
    scores: dict[str, Any] = {}
    costs: list[dict[str, Any]] = []
    for name, overrides in LAYOUTS.items():
        engines = {mesh: engine_for(loaded[mesh], overrides) for mesh in MESHES}
        for mesh, engine in engines.items():
            vocab = engine.info.vocab_size
            calls = [engine.score_batch(works) for works in rounds(vocab)]
            scores[f"{mesh[0]}x{mesh[1]}/{name}"] = {
                "scores": [[s.tolist() for s in call] for call in calls],
                "cache_hits": engine.stats().query_cache_hits,
                "cache_bytes_per_device": cache_bytes_per_device(engine),
            }
        for split, whole in (((2, 1), (1, 1)), ((2, 2), (1, 2))):
            for key, compiled in engines[split].executables().items():
                engines[whole].compile_keys([key])
                scored = key[0] != "prefix"  # every other step ends in the LM head loop
                one = engines[whole].executables()[key]
                loop = loop_1 = 0.0
                if scored:
                    loop = score_chunk_flops(loaded[whole], key[1].labels, compiled)
                    loop_1 = score_chunk_flops(loaded[whole], key[1].labels, one)
                costs.append(
                    {
                        "layout": name,
                        "mesh": list(split),
                        "kind": key[0],
                        "dims": list(key[1].astuple()),
                        "flops": flops(compiled),
                        "flops_data_1": flops(one),
                        "score_loop_flops": loop,
                        "score_loop_flops_data_1": loop_1,
                        "output_bytes": output_bytes(compiled),
                        "output_bytes_data_1": output_bytes(one),
                    }
                )
    return {
        "scores": scores,
        "costs": costs,
        "prompts": prompt_answers(loaded),
        "extensions": extension_answers(loaded),
    }


def random_ids(rng: Any, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(10, 250, n))


def extension_answers(loaded: dict[tuple[int, int], Any]) -> dict[str, Any]:
    """Per mesh: queries sharing a 48-token system prompt (three whole blocks), the third
    and fourth read it from the cache (their extension compiled after the second); their
    scores and the reused tokens."""
    out: dict[str, Any] = {}
    for mesh, model in loaded.items():
        engine = engine_for(model, {"multi_item_scoring_delimiter": 3, "background_compile": True})
        rng = np.random.default_rng(2)
        system = random_ids(rng, 50)
        works = [
            ScoreWork(system + random_ids(rng, n), (random_ids(rng, 3), random_ids(rng, 5)), (5, 7))
            for n in (5, 9, 9, 9)
        ]
        scores = []
        for work in works:
            scores.append(engine.score_batch([work])[0].tolist())
            engine.wait_for_background_compiles()
        reused = engine.stats().reused_prefix_tokens
        out[f"{mesh[0]}x{mesh[1]}"] = {"scores": scores, "reused_prefix_tokens": reused}
    return out


def prompt_rounds(vocab: int) -> list[list[Any]]:
    """Prompt log-likelihood: four choices behind one context with three other requests
    (some prefixes computed in one step on either data block), then the same prompts again
    (every prefix read from the query cache)."""
    from replicas.contract import PromptWork

    rng = np.random.default_rng(1)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(10, vocab, n))

    context = ids(40)
    works = [
        PromptWork(tuple(context + ids(n) for n in (2, 5, 1, 9)), top_k=2),
        PromptWork((ids(35),)),
        PromptWork((ids(7), ids(20))),
        PromptWork((ids(50),), top_k=3),
    ]
    return [works, works]


def answer_lists(answer: Any) -> list[list[Any]]:
    return [answer.token_logprobs[1:].tolist(), answer.top_logprobs[1:].tolist()]


def prompt_answers(loaded: dict[tuple[int, int], Any]) -> dict[str, Any]:
    """Per mesh: every prompt's token log-probs and top log-probs, and the reused tokens."""
    out: dict[str, Any] = {}
    for mesh, model in loaded.items():
        engine = engine_for(model, {"multi_item_scoring_delimiter": 3})
        calls = [engine.score_batch(works) for works in prompt_rounds(engine.info.vocab_size)]
        answers = [[[answer_lists(a) for a in work] for work in call] for call in calls]
        out[f"{mesh[0]}x{mesh[1]}"] = {
            "answers": answers,
            "reused_prefix_tokens": engine.stats().reused_prefix_tokens,
        }
    return out


def main(argv: list[str]) -> None:
    import jax

    result = run(Path(argv[0]))
    result["devices"] = jax.device_count()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
