"""Run as ``python -m tests.support.sharded_check DIR[+pallas]...`` with 4 host devices
(XLA_FLAGS set).

For each checkpoint directory: load it on a 1x1 mesh and on a (data=2, model=2) mesh, run
the same right-padded batch (batch-sharded over ``data`` on the big mesh) and print one JSON
line with the max abs log-prob difference and the partition specs the loader produced
(``+int8``: also ``quantization: int8`` through the engine on both meshes, and the collectives
of a row-parallel int8 projection).
The XLA flag must be set before jax initializes, hence a separate process.
"""

from __future__ import annotations

import json
import re
import sys
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import LoadedModel, load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.causal_lm import AttentionSpec
from replicas.model.quant import project_tokens
from replicas.model.token_split import TokenSplit
from replicas.settings import ReplicaSettings
from tests.support.fp32 import fp32_ratio
from tests.support.model_helpers import batch

LENGTHS = [9, 4, 7, 1]
WIDTH = 12


def logprobs(loaded: LoadedModel, tokens: jax.Array, lengths: jax.Array) -> np.ndarray:
    model = loaded.model

    @jax.jit
    def forward(params: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        idx = jnp.arange(WIDTH)
        valid = idx[None, :] < lengths[:, None]  # [B, T]
        mask = (idx[None, :, None] >= idx[None, None, :]) & valid[:, None, :]  # [B, T, T]
        positions = jnp.broadcast_to(idx, tokens.shape)
        hidden = model.hidden_states(params, tokens, positions, AttentionSpec(mask=mask))
        return jax.nn.log_softmax(model.logits(params, hidden), axis=-1)

    return np.asarray(forward(loaded.params, tokens, lengths))


def engine_scores(loaded: LoadedModel, attention: str) -> list[np.ndarray]:
    """Multi-item scores of two requests through the engine with ``attention``."""
    settings = ReplicaSettings.from_keys(
        multi_item_scoring_delimiter=0,
        attention=attention,
        background_compile=False,
        token_buckets=(16, 32),
        item_token_buckets=(16, 32),
        max_multi_item_seq_len=64,
    )
    mesh = loaded.params["embed"].sharding.mesh
    engine = ScoringEngine(loaded.model, loaded.params, mesh, settings, "tiny")
    rng = np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1, loaded.config.vocab_size, n))

    works = [
        ScoreWork(ids(13), tuple(ids(n) for n in (3, 0, 7, 1, 5)), (5, 7, 9)),
        ScoreWork(ids(4), tuple(ids(n) for n in (2, 6)), (3,)),
    ]
    return engine.score_batch(works)


def pallas_engine_ratio(one: LoadedModel, four: LoadedModel) -> float:
    """The Pallas item attention (interpret mode, per device in shard_map) on the 2x2 mesh
    against the XLA attention on one device, as a fraction of the float32 floor."""
    reference, pallas = engine_scores(one, "xla"), engine_scores(four, "pallas")
    return max(fp32_ratio(b, a) for a, b in zip(reference, pallas, strict=True))


def int8_check(directory: Path, small: Any, big: Any) -> dict[str, Any]:
    """``quantization: int8`` through the engine on the 2x2 mesh (split by tokens,
    model.token_split) against one device: the max abs score difference, and where the
    quantized o and down weights lie."""
    one = load_model(directory, small, quantization="int8")
    four = load_model(directory, big, quantization="int8")
    pairs = zip(engine_scores(one, "xla"), engine_scores(four, "xla"), strict=True)
    layers = four.params["layers"]
    return {
        "int8_engine_diff": max(float(np.abs(a - b).max()) for a, b in pairs),
        "int8_o": spec(layers["attn"]["o"]),
        "int8_down": spec(layers["mlp"]["down"]),
    }


def row_parallel_collectives(big: Any) -> dict[str, list[str]]:
    """The collectives (element type and op) of a row-parallel W8A8 projection compiled on
    the 2x2 mesh (its contracted axis split over ``model``): as one int32 sum (no split) and
    through ``TokenSplit.row_parallel`` (each chip's part rescaled first)."""

    def place(array: jax.Array, *spec: str | None) -> jax.Array:
        return jax.device_put(array, NamedSharding(big, PartitionSpec(*spec)))

    x_q = place(jnp.ones((4, 8, 64), jnp.int8), "data", None, "model")  # [B, T, in]
    x_scale = place(jnp.ones((4, 8, 1), jnp.float32), "data")
    values = place(jnp.ones((64, 32), jnp.int8), "model")  # [in, out]
    scale = place(jnp.ones((32,), jnp.float32))
    forms = {
        "one sum": partial(project_tokens, n_in=1, quantization="int8", dtype=jnp.float32),
        "split": partial(TokenSplit(big).row_parallel, n_in=1, quantization="int8",
                         dtype=jnp.float32),
    }  # fmt: skip
    found = {}
    for name, form in forms.items():
        hlo = jax.jit(form).lower(x_q, x_scale, values, scale).compile().as_text()
        ops = re.findall(r"= (\w+)\[[^\]]*\][^ ]* (all-reduce|reduce-scatter)\(", hlo)
        found[name] = sorted({f"{kind} {op}" for kind, op in ops})
    return found


def spec(array: jax.Array) -> list[Any]:
    return list(array.sharding.spec)


def check(directory: Path, pallas: bool, int8: bool = False) -> dict[str, Any]:
    small = build_mesh((1, 1))
    big = build_mesh((2, 2))
    one = load_model(directory, small)
    four = load_model(directory, big)
    tokens = batch(one.config.vocab_size, LENGTHS, WIDTH)
    lengths = np.asarray(LENGTHS, np.int32)
    reference = logprobs(one, jnp.asarray(tokens), jnp.asarray(lengths))
    rows = NamedSharding(big, PartitionSpec("data"))
    sharded = logprobs(four, jax.device_put(tokens, rows), jax.device_put(lengths, rows))
    diff = max(
        float(np.abs(reference[i, :n] - sharded[i, :n]).max()) for i, n in enumerate(LENGTHS)
    )
    ratio = max(fp32_ratio(sharded[i, :n], reference[i, :n]) for i, n in enumerate(LENGTHS))
    attn, mlp = four.params["layers"]["attn"], four.params["layers"]["mlp"]
    return {
        "directory": directory.name,
        "devices": jax.device_count(),
        "max_abs_diff": diff,
        "fp32_ratio": ratio,
        "pallas_engine_ratio": pallas_engine_ratio(one, four) if pallas else None,
        **(int8_check(directory, small, big) if int8 else {}),
        "row_parallel_all_reduces": row_parallel_collectives(big) if int8 else None,
        "q": spec(attn["q"]),
        "k": spec(attn["k"]),
        "o": spec(attn["o"]),
        "gate": spec(mlp["gate"]),
        "embed": spec(four.params["embed"]),
        "q_devices": len(attn["q"].sharding.device_set),
        "q_shard_shape": list(attn["q"].addressable_shards[0].data.shape),
    }


def main(argv: list[str]) -> None:
    for argument in argv:  # DIR, DIR+pallas (the Pallas engine check), DIR+int8, or both
        directory, *flags = argument.split("+")
        result = check(Path(directory), "pallas" in flags, "int8" in flags)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
