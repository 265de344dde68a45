"""serve_config.yaml: every key is one Ray or ReplicaSettings reads (Ray drops unknown ones).

Also pins the default's promises: SmolLM2 on CPU with multi-item scoring on, a delimiter that
ordinary text never produces, autoscaling targets below the concurrency caps, 503 on overload.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from ray.serve.config import AutoscalingConfig
from ray.serve.schema import (
    DeploymentSchema,
    RayActorOptionsSchema,
    ServeApplicationSchema,
    ServeDeploySchema,
)

from app.builder import build_app
from app.ingress import ScoreIngress
from replicas.serving.deployment import ScoringReplica
from replicas.serving.setup import RECONFIGURABLE, apply_user_config
from replicas.settings import ReplicaSettings, SettingsError

CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"
SETTINGS_KEYS = ReplicaSettings.setting_names()


GPU_CONFIG = CONFIG.with_name("serve_config.gpu.yaml")


def load(config: Path = CONFIG) -> dict[str, Any]:
    return yaml.safe_load(config.read_text())


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``Optional[...]``, ``List[...]`` or ``Union[...]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, typing.List):  # noqa: UP006
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


# Fields Ray types as a plain dict but reads with a model of its own (or that we read).
DICT_FIELDS: dict[tuple[type[BaseModel], str], Any] = {
    (DeploymentSchema, "autoscaling_config"): AutoscalingConfig,
    (DeploymentSchema, "ray_actor_options"): RayActorOptionsSchema,
    (DeploymentSchema, "user_config"): RECONFIGURABLE,
    (ServeApplicationSchema, "args"): SETTINGS_KEYS,
    (ServeApplicationSchema, "runtime_env"): {"env_vars"},
}


def unknown_keys(data: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """Dotted paths of keys in ``data`` that ``model`` (recursively) does not read."""
    if isinstance(data, list):
        return [
            k for i, item in enumerate(data) for k in unknown_keys(item, model, f"{where}[{i}]")
        ]
    if not isinstance(data, dict):
        return []
    found: list[str] = []
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        field = model.model_fields.get(key)
        if field is None:
            found.append(path)
            continue
        special = DICT_FIELDS.get((model, key))
        if isinstance(special, type) and issubclass(special, BaseModel):
            found += unknown_keys(value, special, path)
        elif special is not None:
            found += [f"{path}.{k}" for k in value if k not in special]
        elif (inner := _model_in(field.annotation)) is not None:
            found += unknown_keys(value, inner, path)
    return found


@pytest.mark.parametrize("config", [CONFIG, GPU_CONFIG], ids=lambda p: p.name)
def test_ray_accepts_the_file(config: Path) -> None:
    ServeDeploySchema.model_validate(load(config))


@pytest.mark.parametrize("config", [CONFIG, GPU_CONFIG], ids=lambda p: p.name)
def test_every_key_is_read_by_ray_or_the_replica_settings(config: Path) -> None:
    assert unknown_keys(load(config), ServeDeploySchema) == []


def test_the_gpu_config_batches_in_bfloat16_on_one_gpu() -> None:
    (app,) = load(GPU_CONFIG)["applications"]
    settings = ReplicaSettings.from_mapping(app["args"])
    assert (settings.model.dtype, settings.engine.attention) == ("bfloat16", "auto")
    assert dict(settings.placement.host_resources)["GPU"] == 1
    replica = next(d for d in app["deployments"] if d["name"] == "ScoringReplica")
    assert replica["max_ongoing_requests"] >= settings.batching.max_batch_size == 64
    assert settings.engine.batch_buckets[-1] == settings.batching.max_batch_size


def test_the_key_checker_catches_typos() -> None:
    data = load()
    data["http_options"]["prot"] = 1
    app = data["applications"][0]
    app["args"]["max_batch"] = 4
    replica = app["deployments"][1]
    replica["autoscaling_config"]["target_ongoing_request"] = 2
    replica["ray_actor_options"] = {"num_gpu": 1}
    replica["max_queued_request"] = 3
    replica["user_config"]["dtype"] = "bfloat16"
    assert sorted(unknown_keys(data, ServeDeploySchema)) == [
        "applications[0].args.max_batch",
        "applications[0].deployments[1].autoscaling_config.target_ongoing_request",
        "applications[0].deployments[1].max_queued_request",
        "applications[0].deployments[1].ray_actor_options.num_gpu",
        "applications[0].deployments[1].user_config.dtype",
        "http_options.prot",
    ]


def test_one_application_wired_to_the_builder() -> None:
    (app,) = load()["applications"]
    assert app["import_path"] == "app.builder:build_app"
    assert app["route_prefix"] == "/"
    names = {d["name"] for d in app["deployments"]}
    assert names == {ScoreIngress.name, ScoringReplica.name}
    built = build_app(app["args"])
    assert built is not None


def test_defaults_serve_smollm2_with_multi_item_on() -> None:
    (app,) = load()["applications"]
    settings = ReplicaSettings.from_mapping(app["args"])
    assert settings.model.name == "SmolLM2-135M-Instruct"
    assert settings.model.multi_item_scoring_delimiter is not None  # 0 is a valid delimiter
    assert settings.model.multi_item
    assert settings.placement.mesh_shape == (1, 1)


def test_deployments_scale_by_queue_depth_and_shed_overload() -> None:
    (app,) = load()["applications"]
    for deployment in app["deployments"]:
        schema = DeploymentSchema.model_validate(deployment)
        autoscaling = AutoscalingConfig.model_validate(deployment["autoscaling_config"])
        assert autoscaling.min_replicas >= 1
        assert autoscaling.max_replicas >= autoscaling.min_replicas
        assert autoscaling.target_ongoing_requests < schema.max_ongoing_requests
        assert {"upscale_delay_s", "downscale_delay_s"} <= set(deployment["autoscaling_config"])
        assert schema.max_queued_requests > 0  # bounded queue: excess answered 503 at once
    ingress = next(d for d in app["deployments"] if d["name"] == ScoreIngress.name)
    assert 0 < ingress["ray_actor_options"]["num_cpus"] < 1  # fractional CPU
    # A dead ingress leaves another to answer; a stopping one finishes its requests first.
    assert ingress["autoscaling_config"]["min_replicas"] >= 2
    assert ingress["graceful_shutdown_timeout_s"] > ReplicaSettings().batching.request_deadline_s
    replica = next(d for d in app["deployments"] if d["name"] == ScoringReplica.name)
    assert "ray_actor_options" not in replica  # host_resources sets them: one place
    settings = ReplicaSettings.from_mapping(app["args"])
    assert settings.placement.host_bundle == {"CPU": 1}
    assert replica["max_ongoing_requests"] >= settings.batching.max_batch_size  # a batch can fill
    assert set(replica["user_config"]) <= RECONFIGURABLE
    # The start-up reconfigure() accepts it (it may only touch batching settings).
    assert apply_user_config(settings, replica["user_config"]).batching.max_batch_size >= 1
    # Overload is answered well before any proxy timeout (semantics 12).
    assert 0 < settings.batching.max_queue_wait_s <= 10
    assert settings.batching.request_deadline_s < load()["http_options"]["request_timeout_s"]


def test_bad_args_fail_naming_the_setting() -> None:
    (app,) = load()["applications"]
    with pytest.raises(SettingsError, match=r"^max_batch: unknown"):
        build_app({**app["args"], "max_batch": 4})
    with pytest.raises(SettingsError, match=r"^max_items_per_request"):
        build_app({**app["args"], "max_items_per_request": 5000})
    small = {**app["args"], "token_buckets": [16, 64, 128], "item_token_buckets": [16, 64, 128]}
    with pytest.raises(SettingsError, match=r"^completion_warmup_shapes: .* beyond the buckets"):
        build_app(small)
    with pytest.raises(SettingsError, match=r"^rerank_method: must be one of"):
        build_app({**app["args"], "rerank_method": "bm25"})


def test_the_delimiter_is_a_special_token_ordinary_text_never_produces() -> None:
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    (app,) = load()["applications"]
    settings = ReplicaSettings.from_mapping(app["args"])
    delimiter = settings.model.multi_item_scoring_delimiter
    assert delimiter is not None
    tokenizer = load_tokenizer(resolve_model_source(settings.model.name))
    assert delimiter in tokenizer.all_special_ids
    assert tokenizer.convert_ids_to_tokens(delimiter) == "<|endoftext|>"
    text = "".join(chr(c) for c in range(32, 0x250)) + " The capital of France is Paris.\n\t<|"
    for add_special_tokens in (True, False):
        ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert delimiter not in ids
    # Only the literal special-token text maps to it (the ingress rejects that: 400).
    assert delimiter in tokenizer("<|endoftext|>", add_special_tokens=False)["input_ids"]
