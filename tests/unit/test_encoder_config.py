"""Encoder configs (BERT, XLM-RoBERTa, ModernBERT) read into ModelConfig, heads and pooling
limits; what is not supported is refused naming the field (jax-free)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replicas.model.catalog import hf_config
from replicas.model.config import config_from_hf
from replicas.model.errors import UnsupportedModelError
from replicas.model.head_config import UnsupportedHeadError, with_saved_activation
from replicas.model.pooling_config import pooling_head_for, served_pooling_head
from replicas.model.st_inputs import UnsupportedEmbeddingError
from replicas.settings import ModelSettings, SettingsError

BERT = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "vocab_size": 30,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-7,
}
XLMR = {**BERT, "model_type": "xlm-roberta", "architectures": ["XLMRobertaModel"]}
XLMR |= {"max_position_embeddings": 130, "type_vocab_size": 1, "pad_token_id": 1}


def test_bert_and_xlm_roberta_read_into_encoder_fields() -> None:
    bert = config_from_hf(hf_config(BERT))
    assert (bert.family, bert.encoder, bert.hidden_act, bert.rms_norm_eps) == (
        "bert", True, "gelu", 1e-7,
    )  # fmt: skip
    assert (bert.head_dim, bert.type_vocab_size, bert.position_offset) == (8, 2, 0)
    xlmr = config_from_hf(hf_config(XLMR))
    assert (xlmr.family, xlmr.position_offset, xlmr.type_vocab_size) == ("xlm_roberta", 2, 1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ],
)
def test_what_an_encoder_cannot_run_is_refused_by_name(change: dict, field: str) -> None:
    with pytest.raises(UnsupportedModelError, match=field):
        config_from_hf(hf_config({**BERT, **change}))


def test_an_encoder_embeds_no_further_than_its_positions() -> None:
    assert pooling_head_for(None, hf_config(BERT)).max_seq_length == 128
    assert pooling_head_for(None, hf_config(XLMR)).max_seq_length == 128  # 130 - (pad + 1)


def test_a_cross_encoder_head_takes_the_activation_its_directory_saved(tmp_path: Path) -> None:
    values = {**BERT, "architectures": ["BertForSequenceClassification"], "num_labels": 1}
    head = config_from_hf(hf_config(values)).head
    assert (head.kind, head.activation, head.max_length) == ("cross_encoder", "sigmoid", 128)
    assert pooling_head_for(tmp_path, hf_config(values)) is None  # no embedding pooling
    saved = tmp_path / "config_sentence_transformers.json"
    saved.write_text(json.dumps({"activation_fn": "torch.nn.modules.linear.Identity"}))
    assert with_saved_activation(head, tmp_path).activation == "identity"
    saved.write_text(json.dumps({"activation_fn": "torch.nn.modules.activation.ReLU"}))
    with pytest.raises(UnsupportedHeadError, match="activation_fn"):
        with_saved_activation(head, tmp_path)
    many = config_from_hf(hf_config({**values, "num_labels": 3})).head
    assert many.activation == "identity"


def test_an_encoder_takes_int8_weight_only_naming_the_setting() -> None:
    """An encoder's activations stay float: the weight-only form runs its projections
    (tests/engine/test_encoder_int8_weight.py); the activation forms are refused."""
    bert = config_from_hf(hf_config(BERT))
    assert bert.replace(quantization="none").quantization == "none"
    assert bert.replace(quantization="int8_weight").quantization == "int8_weight"
    for form in ("int8", "int8_smooth", "fp8"):
        with pytest.raises(UnsupportedModelError, match=rf"^quantization: '{form}' quantizes"):
            bert.replace(quantization=form)


MODERNBERT = {
    "model_type": "modernbert",
    "architectures": ["ModernBertForSequenceClassification"],
    "vocab_size": 30,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
    "global_attn_every_n_layers": 2,
    "local_attention": 16,
    "global_rope_theta": 5000.0,
    "local_rope_theta": 300.0,
    "norm_eps": 1e-6,
    "classifier_pooling": "mean",
    "num_labels": 1,
}


def test_modernbert_reads_its_windows_rope_bases_norm_biases_and_head() -> None:
    config = config_from_hf(hf_config(MODERNBERT))
    assert (config.family, config.encoder, config.rotary, config.norm_bias) == (
        "modernbert", True, True, False,
    )  # fmt: skip
    assert config.sliding_window == 8  # +-local_attention / 2
    assert config.sliding_layers == (False, True, False, True)  # global every 2nd from 0
    assert (config.rope_theta, config.local_rope_theta, config.rms_norm_eps) == (5e3, 300, 1e-6)
    head = config.head
    assert (head.kind, head.pooling, head.norm_eps, head.activation) == (
        "cross_encoder", "mean", 1e-6, "sigmoid",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_activation": "silu"}, "hidden_activation"),
        ({"classifier_activation": "tanh"}, "classifier_activation"),
    ],
)
def test_what_modernbert_cannot_run_is_refused_by_name(change: dict, field: str) -> None:
    with pytest.raises((UnsupportedModelError, UnsupportedHeadError), match=field):
        config_from_hf(hf_config({**MODERNBERT, **change}))


@pytest.mark.parametrize(
    ("declared", "settings", "own", "sizes"),
    [
        ({}, {}, None, None),  # declared nowhere: no cut
        ({"matryoshka_dimensions": [16, 8, 16]}, {}, (8, 16), (8, 16)),
        ({"is_matryoshka": True}, {}, (), ()),  # any size
        ({}, {"matryoshka_dimensions": (4, 8)}, None, (4, 8)),
        ({"matryoshka_dimensions": [16]}, {"matryoshka_dimensions": (4,)}, (16,), (4,)),
        ({}, {"is_matryoshka": True}, None, ()),
        ({"matryoshka_dimensions": [8]}, {"is_matryoshka": True}, (8,), (8,)),
        ({"is_matryoshka": True}, {"is_matryoshka": False}, (), None),
    ],
)
def test_matryoshka_sizes_are_config_jsons_unless_the_settings_say_otherwise(
    declared: dict, settings: dict, own: tuple | None, sizes: tuple | None
) -> None:
    # vLLM reads is_matryoshka and matryoshka_dimensions from the HF config
    hf = hf_config({**BERT, **declared})
    assert pooling_head_for(None, hf).matryoshka == own
    assert served_pooling_head(None, hf, ModelSettings(**settings)).matryoshka == sizes


def test_matryoshka_sizes_past_the_vector_or_on_a_model_that_embeds_nothing_fail_start_up() -> None:
    with pytest.raises(UnsupportedEmbeddingError, match="matryoshka_dimensions"):
        pooling_head_for(None, hf_config({**BERT, "matryoshka_dimensions": [16, 64]}))
    with pytest.raises(SettingsError, match=r"matryoshka_dimensions: \[8, 33\] .*1..32"):
        served_pooling_head(None, hf_config(BERT), ModelSettings(matryoshka_dimensions=(8, 33)))
    classifier = {**BERT, "architectures": ["BertForSequenceClassification"], "num_labels": 1}
    with pytest.raises(SettingsError, match="not an embedding model"):
        served_pooling_head(None, hf_config(classifier), ModelSettings(is_matryoshka=True))
    assert served_pooling_head(None, hf_config(classifier), ModelSettings()) is None
