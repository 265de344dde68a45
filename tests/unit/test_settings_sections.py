"""ReplicaSettings in sections (replicas/settings/): the flat keys every config has used still
load, sections load the same, each error names its setting, and warm-up envelopes derive from
a stated workload (the shipped one: the four envelopes serve_config.yaml used to write out)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from replicas.settings import (
    BatchingSettings,
    ReplicaSettings,
    SettingsError,
    WarmupWorkload,
    derive_envelopes,
)
from tests.support.shipped import shipped_args

# Every key of the flat ReplicaSettings before sections (a config written for it still loads).
FLAT_KEYS = [
    "model",
    "dtype",
    "mesh_shape",
    "multi_item_scoring_delimiter",
    "layout",
    "attention",
    "token_buckets",
    "item_token_buckets",
    "batch_buckets",
    "item_tokens_per_step",
    "fused_step_tokens",
    "query_cache_bytes",
    "prefix_reuse",
    "background_compile",
    "max_traffic_signatures",
    "max_items_per_request",
    "max_multi_item_seq_len",
    "max_request_tokens",
    "max_batch_size",
    "batch_wait_timeout_s",
    "max_call_s",
    "max_queue_wait_s",
    "engine_niceness",
    "request_deadline_s",
    "rerank_method",
    "rerank_template",
    "api_keys_env",
    "api_keys_file",
    "compilation_cache_dir",
    "pooling",
    "normalize",
    "warmup_shapes",
    "warmup_batch_sizes",
    "completion_warmup_shapes",
    "limit_to_warmup",
    "hosts_per_replica",
    "host_resources",
    "placement_group_strategy",
    "host_label_selector",
    "host_timeout_s",
    "tpu_slice",
    "lora_adapters",
    "max_loras",
    "max_lora_rank",
]
# The envelopes serve_config.yaml wrote out before it stated its workload.
SHIPPED_ENVELOPES = ((32, 4, 8, 128), (128, 16, 16, 128), (512, 64, 32, 128), (2048, 4, 512, 128))


def test_every_flat_key_of_before_still_names_a_setting() -> None:
    assert set(FLAT_KEYS) <= ReplicaSettings.setting_names()
    defaults = ReplicaSettings()
    for key in FLAT_KEYS:
        defaults.value(key)  # each reads back from its section


@pytest.mark.parametrize("name", ["serve_config.yaml", "serve_config.gpu.yaml"])
def test_the_shipped_workload_derives_the_envelopes_it_used_to_write_out(name: str) -> None:
    settings = ReplicaSettings.from_mapping(shipped_args(name))
    assert settings.warmup.warmup_workload is not None and settings.warmup.warmup_shapes is None
    assert settings.warmup_shapes == SHIPPED_ENVELOPES
    assert [(e.query_tokens, e.item_tokens, e.labels) for e in settings.limits.envelopes] == [
        (q, t, labels) for q, _, t, labels in SHIPPED_ENVELOPES
    ]


def test_derive_envelopes_in_tiers() -> None:
    shipped = WarmupWorkload(query_tokens=(32, 2048), item_tokens=(8, 512), labels=128, items=4)
    # Queries 4x longer each tier, items 2x longer and 4x more (at most 2048 stream tokens);
    # the last tier: the longest query with a full step of the longest items.
    assert derive_envelopes(shipped, 2048) == SHIPPED_ENVELOPES
    assert derive_envelopes(shipped, 1024) == (
        (32, 4, 8, 128),
        (128, 16, 16, 128),
        (512, 32, 32, 128),
        (2048, 2, 512, 128),
    )
    one = WarmupWorkload(query_tokens=(64, 64), item_tokens=(16, 600))
    assert derive_envelopes(one, 512) == ((64, 1, 600, 1),)  # at least one item
    nine = WarmupWorkload(query_tokens=(10, 900), item_tokens=(2, 100), items=1, ratio=9)
    assert derive_envelopes(nine, 2048) == (
        (10, 1, 2, 1),
        (90, 9, 6, 1),
        (810, 81, 18, 1),
        (900, 20, 100, 1),
    )


def test_written_out_warmup_shapes_still_load_and_replace_the_workload() -> None:
    args = shipped_args()
    old = {k: v for k, v in args.items() if k != "warmup_workload"}
    old["warmup_shapes"] = [list(s) for s in SHIPPED_ENVELOPES]
    assert ReplicaSettings.from_mapping(old) == ReplicaSettings.from_mapping(args).replace(
        warmup_workload=None, warmup_shapes=SHIPPED_ENVELOPES
    )
    assert ReplicaSettings.from_mapping(old).warmup_shapes == SHIPPED_ENVELOPES
    both = ReplicaSettings.from_mapping({**args, "warmup_shapes": [[8, 1, 1, 4]]})
    assert both.warmup_shapes == ((8, 1, 1, 4),)
    none = ReplicaSettings.from_mapping({**args, "warmup_shapes": [], "limit_to_warmup": False})
    assert none.warmup_shapes == ()
    with pytest.raises(SettingsError, match=r"^limit_to_warmup: needs warmup_shapes"):
        ReplicaSettings.from_mapping({**args, "warmup_shapes": []})


def test_sections_load_as_the_flat_keys_do() -> None:
    flat = ReplicaSettings.from_keys(
        model="m", dtype="bfloat16", max_batch_size=4, batch_buckets=[1, 4], max_loras=2
    )
    grouped = ReplicaSettings.from_mapping(
        {
            "model": {"name": "m", "dtype": "bfloat16"},
            "batching": {"max_batch_size": 4},
            "engine": {"batch_buckets": [1, 4]},
            "adapters": {"max_loras": 2},
        }
    )
    assert grouped == flat
    assert flat.model.name == "m" and flat.batching == BatchingSettings(max_batch_size=4)
    assert flat.engine.batch_buckets == (1, 4)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_batch": 4}, r"^max_batch: unknown replica setting"),
        ({"batching": {"max_batch": 4}}, r"^batching.max_batch: unknown batching setting"),
        ({"batching": {"dtype": "float32"}}, r"^batching.dtype: unknown batching setting"),
        ({"batching": 4}, r"^batching: a section, expected a mapping"),
        ({"max_batch_size": 4, "batching": {"max_batch_size": 8}}, r"^max_batch_size: set twice"),
        ({"warmup_workload": {"query_tokens": [1, 8]}}, r"^warmup_workload.item_tokens: required"),
        (
            {"warmup_workload": {"query_tokens": [1, 8], "item_tokens": [1, 2], "tiers": 3}},
            r"^warmup_workload.tiers: unknown key",
        ),
        (
            {"warmup_workload": {"query_tokens": [9, 8], "item_tokens": [1, 2]}},
            r"^warmup_workload.query_tokens: must be \[shortest, longest\]",
        ),
        (
            {"warmup_workload": {"query_tokens": [1, 8], "item_tokens": [1, 2], "ratio": 1}},
            r"^warmup_workload.ratio: must be an int >= 2",
        ),
        ({"dtype": "float16"}, r"^dtype: must be one of"),
        ({"layout": "dense"}, r"^layout: must be one of"),
        ({"max_queue_wait_s": -1}, r"^max_queue_wait_s: must be >= 0"),
        ({"max_queue_wait_s": math.nan}, r"^max_queue_wait_s: must be >= 0, got nan"),
        ({"batch_wait_timeout_s": math.nan}, r"^batch_wait_timeout_s: must be >= 0, got nan"),
        ({"max_call_s": math.nan}, r"^max_call_s: must be >= 0 \(0 = unbounded\), got nan"),
        ({"rerank_method": "bm25"}, r"^rerank_method: must be one of"),
        ({"placement_group_strategy": "ANY"}, r"^placement_group_strategy: must be one of"),
        ({"host_timeout_s": 0}, r"^host_timeout_s: must be > 0"),
        ({"host_compile_timeout_s": -1}, r"^host_compile_timeout_s: must be > 0"),
        ({"lora_adapters": {"a": "/x"}}, r"^max_loras: 0 slots cannot hold"),
        ({"warmup_batch_sizes": [32]}, r"^warmup_batch_sizes: each must be in \[1, 16\]"),
        ({"matryoshka_dimensions": [0, 8]}, r"^matryoshka_dimensions: must be positive ints"),
        ({"matryoshka_dimensions": []}, r"^matryoshka_dimensions: must be positive ints"),
        (
            {"matryoshka_dimensions": [8], "is_matryoshka": False},
            r"^matryoshka_dimensions: set with is_matryoshka: false",
        ),
    ],
)
def test_each_error_names_the_setting(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        ReplicaSettings.from_mapping(values)


def test_replace_by_flat_key_or_whole_section_runs_every_check_again() -> None:
    settings = ReplicaSettings()
    assert settings.replace(max_batch_size=4).batching.max_batch_size == 4
    assert settings.replace(batching=BatchingSettings(max_call_s=9)).value("max_call_s")
    assert settings.replace(model="x").model.name == "x"
    with pytest.raises(SettingsError, match=r"^max_batch: unknown replica setting"):
        settings.replace(max_batch=4)
    with pytest.raises(SettingsError, match=r"^warmup_batch_sizes: each must be in \[1, 2\]"):
        settings.replace(warmup_batch_sizes=(4,), batch_buckets=(1, 2))
