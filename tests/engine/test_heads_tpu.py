"""A score-head model's steps compiled for a TPU slice here, with compile-only libtpu
(``planning.tpu_check``): a small ``Qwen3ForSequenceClassification`` config on v6e:2x2,
mesh [1, 4], the smallest signature of each step kind; and a small
``XLMRobertaForSequenceClassification`` cross-encoder's (bge-reranker-v2-m3's architecture: its
packed pairs through the Pallas segment kernel, the TPU default), with its projection. One
background process each at nice 19 (tests/support/background.py), small models, so they add
little to the suite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.background import Command

pytestmark = pytest.mark.after_serve

KEY = "tpu_check v6e:2x2 qwen3 seq-cls"
CONFIG = {  # config.json values, as save_pretrained writes them
    "model_type": "qwen3",
    "architectures": ["Qwen3ForSequenceClassification"],
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "num_labels": 2,
    "pad_token_id": 0,
}


ENCODER_KEY = "tpu_check v6e:2x2 xlm-roberta cross-encoder"
ENCODER = {  # bge-reranker-v2-m3's architecture, small
    "model_type": "xlm-roberta",
    "architectures": ["XLMRobertaForSequenceClassification"],
    "num_labels": 1,
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "pad_token_id": 1,
    "layer_norm_eps": 1e-05,
}


def background_commands(folder: Path) -> dict[str, Command]:
    commands = {}
    for key, config, name in ((KEY, CONFIG, "head"), (ENCODER_KEY, ENCODER, "encoder")):
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps(config))
        out = folder / f"{name}-plan.json"
        args = [sys.executable, "-m", "planning.tpu_check", "--topology", "v6e:2x2"]
        args += ["--model", str(folder / name), "--signatures", "smallest"]
        args += ["--projection"] if name == "encoder" else ["--no-projection"]
        commands[key] = Command((*args, "--json", str(out)), out, niceness=19)
    return commands


def test_a_head_models_steps_compile_for_a_v6e_slice(background: dict) -> None:
    done = background[KEY].result(timeout_s=900)
    assert done.returncode == 0, done.stdout
    plan = json.loads(done.out.read_text())
    assert plan["fits"] and tuple(plan["mesh"]) == (1, 4)
    assert {step["kind"] for step in plan["steps"]} == {"prefix", "items", "rows"}
    for step in plan["steps"]:
        assert step["xla_flops"] > 0


def test_an_encoders_steps_compile_for_a_v6e_slice_with_the_pallas_kernel(background) -> None:
    from planning.tpu_projection import step_flops
    from replicas.engine.layouts.embed_packing import EmbedDims
    from replicas.model.catalog import model_config

    done = background[ENCODER_KEY].result(timeout_s=900)
    assert done.returncode == 0, done.stdout
    plan = json.loads(done.out.read_text())
    assert plan["fits"] and tuple(plan["mesh"]) == (1, 4)
    assert {step["kind"] for step in plan["steps"]} == {"embed"}
    assert all(step["xla_flops"] > 0 for step in plan["steps"])
    # Projected: one full row and the fullest step, their compiled FLOPs (every layer, the
    # kernel by its cost estimate) against BERT's analytic ones (two MLP matrices).
    (one, fullest) = plan["projection"]
    assert one["steps"][0]["dims"][0] == 1 < fullest["steps"][0]["dims"][0]
    config = model_config(str(done.out.parent / "encoder" / "config.json"))
    for row in plan["projection"]:
        (step,) = row["steps"]
        analytic = step_flops(config, "embed", EmbedDims(*step["dims"]), 0)
        assert 0.95 <= step["flops_per_chip"] * 4 / analytic <= 1.15, step["dims"]
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["latency_s"], rel=1e-3)


def test_head_parameters_take_their_axes_from_the_one_table() -> None:
    from cluster.sharding import LOGICAL_AXIS_RULES
    from replicas.contract import ScoreHead
    from replicas.model.heads import head_logical_axes

    reward = head_logical_axes(ScoreHead("reward_mlp", 1, ("LABEL_0",)))
    assert reward["dense"] == ("embed", "head_hidden")
    assert LOGICAL_AXIS_RULES["head_hidden"] == "model"  # split like the MLP
    assert LOGICAL_AXIS_RULES["labels"] is None  # a few outputs: replicated
