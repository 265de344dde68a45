"""A score-head model's steps compiled for a TPU slice here, with compile-only libtpu
(``planning.tpu_check``): a small ``Qwen3ForSequenceClassification`` config on v6e:2x2,
mesh [1, 4], the smallest signature of each step kind; and a small
``XLMRobertaForSequenceClassification`` cross-encoder's (bge-reranker-v2-m3's architecture: its
packed pairs through the Pallas segment kernel, the TPU default) through the planner. One
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
        model = ["--topology", "v6e:2x2", "--model", str(folder / name), "--json", str(out)]
        if name == "encoder":  # the planner, one layout: its fit and projection
            args = ["planning.plan", *model, "--mesh", "1,4", "--no-verify-winner"]
        else:
            args = ["planning.tpu_check", *model, "--signatures", "smallest", "--no-projection"]
        commands[key] = Command((sys.executable, "-m", *args), out, niceness=19)
    return commands


def test_a_head_models_steps_compile_for_a_v6e_slice(background: dict) -> None:
    done = background[KEY].result(timeout_s=900)
    assert done.returncode == 0, done.stdout
    plan = json.loads(done.out.read_text())
    assert plan["fits"] and tuple(plan["mesh"]) == (1, 4)
    assert {step["kind"] for step in plan["steps"]} == {"prefix", "items", "rows"}
    for step in plan["steps"]:
        assert step["xla_flops"] > 0


def test_the_planner_fits_and_projects_a_cross_encoder_on_a_v6e_slice(background) -> None:
    """``planning.plan`` on the cross-encoder's ``config.json`` (layout [1, 4]): its fullest
    embed step compiles (the Pallas segment kernel) and fits; the projection's compiled FLOPs
    per chip (every layer, the kernel by its cost estimate) add up to BERT's analytic ones
    (two MLP matrices), and its items/s are its tokens/s over a (query, item) pair's tokens."""
    from planning.tpu_projection import step_flops
    from replicas.engine.layouts.embed_packing import EmbedDims
    from replicas.model.catalog import model_config

    done = background[ENCODER_KEY].result(timeout_s=900)
    assert done.returncode == 0, done.stdout
    plan = json.loads(done.out.read_text())
    (row,) = plan["rows"]
    assert row["fits"] and row["mesh"] == [1, 4]
    (step,) = row["steps"]
    assert step["kind"] == "embed" and step["dims"][0] == row["requests_per_step"] > 1
    config = model_config(str(done.out.parent / "encoder" / "config.json"))
    analytic = step_flops(config, "embed", EmbedDims(*step["dims"]), 0)
    assert 0.95 <= step["flops_per_chip"] * 4 / analytic <= 1.15
    query, _, item_tokens = plan["workload"]
    pairs_per_s = row["tokens_per_s_per_replica"] / (query + item_tokens)
    assert row["items_per_s_per_slice"] == pytest.approx(pairs_per_s, rel=1e-3)


def test_head_parameters_take_their_axes_from_the_one_table() -> None:
    from cluster.sharding import LOGICAL_AXIS_RULES
    from replicas.contract import ScoreHead
    from replicas.model.heads import head_logical_axes

    reward = head_logical_axes(ScoreHead("reward_mlp", 1, ("LABEL_0",)))
    assert reward["dense"] == ("embed", "head_hidden")
    assert LOGICAL_AXIS_RULES["head_hidden"] == "model"  # split like the MLP
    assert LOGICAL_AXIS_RULES["labels"] is None  # a few outputs: replicated
