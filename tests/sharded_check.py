"""Run as ``python -m tests.sharded_check DIR...`` with 4 host devices (XLA_FLAGS set).

For each checkpoint directory: load it on a 1x1 mesh and on a (data=2, model=2) mesh, run
the same right-padded batch (batch-sharded over ``data`` on the big mesh) and print one JSON
line with the max abs log-prob difference and the partition specs the loader produced.
The XLA flag must be set before jax initializes, hence a separate process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from cluster.mesh import build_mesh
from replicas.loading import LoadedModel, load_model
from replicas.model import AttentionSpec
from tests.model_helpers import batch

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


def spec(array: jax.Array) -> list[Any]:
    return list(array.sharding.spec)


def check(directory: Path) -> dict[str, Any]:
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
    attn, mlp = four.params["layers"]["attn"], four.params["layers"]["mlp"]
    return {
        "directory": directory.name,
        "devices": jax.device_count(),
        "max_abs_diff": diff,
        "q": spec(attn["q"]),
        "k": spec(attn["k"]),
        "o": spec(attn["o"]),
        "gate": spec(mlp["gate"]),
        "embed": spec(four.params["embed"]),
        "q_devices": len(attn["q"].sharding.device_set),
        "q_shard_shape": list(attn["q"].addressable_shards[0].data.shape),
    }


def main(argv: list[str]) -> None:
    for directory in argv:
        print(json.dumps(check(Path(directory))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
