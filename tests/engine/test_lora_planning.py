"""The planner and planning.tpu_check count LoRA adapter slots (issue 45, semantics 21): the
slots' stacks in the bytes per chip, and every step compiled with the low-rank update. Held
on a CPU mesh with shape-only parameters, as the TPU tools hold them on a compile-only
slice: the bytes against the arithmetic of the model's shapes, the compiled FLOPs against
the same step without slots."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from cluster.mesh import build_mesh
from planning.tpu_check import abstract_params, lora_slots, parse_args, step_row
from replicas.engine.scoring_engine import ScoringEngine
from replicas.model.catalog import model_config
from replicas.model.causal_lm import CausalLM
from replicas.settings import ReplicaSettings
from tests.support.model_helpers import save_tiny

SLOTS, RANK = 3, 8


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    directory = save_tiny("qwen3", tmp_path_factory.mktemp("lora-plan") / "base")
    return CausalLM(model_config(str(Path(directory) / "config.json")), jnp.float32)


def projection_sizes(model: CausalLM) -> int:
    """in + out of q, k, v, o, gate, up and down of one layer, from the config."""
    c = model.config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    d, f = c.hidden_size, c.intermediate_size
    return (d + q) + 2 * (d + kv) + (q + d) + 2 * (d + f) + (f + d)


def test_the_slots_bytes_are_every_slot_a_and_b_of_every_layer(model):
    mesh = build_mesh((1, 1), jax.devices()[:1])
    _, base = abstract_params(model, mesh)
    params, with_slots = abstract_params(model, mesh, (SLOTS, RANK))
    layers = model.config.num_layers
    expected = (SLOTS + 1) * RANK * projection_sizes(model) * layers * 4  # float32
    assert with_slots - base == expected
    assert set(params["lora"]) >= {"layers"}


def test_steps_compile_with_the_low_rank_update(model):
    mesh = build_mesh((1, 1), jax.devices()[:1])
    settings = ReplicaSettings.from_keys(
        model="tiny", token_buckets=(16, 32), item_token_buckets=(16, 32), batch_buckets=(1,),
        background_compile=False, multi_item_scoring_delimiter=0, warmup_shapes=((16, 2, 8, 4),),
    )  # fmt: skip
    flops = {}
    for lora in (None, (SLOTS, RANK)):
        params, _ = abstract_params(model, mesh, lora)
        engine = ScoringEngine(model, params, mesh, settings, name="tiny")
        key = next(k for k in engine.warmup_keys() if k[0] == "items")
        engine.compile_keys([key])
        flops[lora] = step_row(*key, engine.executables()[key], None, 0)["xla_flops"]
    assert flops[(SLOTS, RANK)] > flops[None]


def test_the_tools_take_the_slots_from_their_flags():
    args = parse_args(["--topology", "v6e:2x2", "--max-loras", "4", "--max-lora-rank", "32"])
    assert lora_slots(args) == (4, 32)
    assert lora_slots(parse_args(["--topology", "v6e:2x2"])) is None
    with pytest.raises(ValueError, match="--max-lora-rank"):
        lora_slots(
            parse_args(["--topology", "v6e:2x2", "--max-loras", "1", "--max-lora-rank", "0"])
        )
