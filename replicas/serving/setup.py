"""How a scoring replica starts: its settings from a Serve config, the model's checks that
run before any weights load, the engine factory, and the settings ``user_config`` may change
(jax-free; batch jobs build their engines with the same factory)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cluster.host_group import load_factory
from replicas.checkpoints.sources import ModelSourceError, load_hf_config, resolve_model_source
from replicas.settings import ReplicaSettings, SettingsError, check_delimiter_in_vocab
from replicas.settings.replica import SECTIONS

DEFAULT_ENGINE = "replicas.engine:ScoringEngine"
GROUP_ENGINE = "replicas.engine:GroupEngine"  # the default when hosts_per_replica > 1
SLICE_ENGINE = "replicas.engine:SliceEngine"  # ... and tpu_slice is set
# Settings that change how requests are batched, not what is loaded or compiled.
RECONFIGURABLE = frozenset({"max_batch_size", "batch_wait_timeout_s"})


def coerce_settings(settings: ReplicaSettings | Mapping[str, Any]) -> ReplicaSettings:
    if isinstance(settings, ReplicaSettings):
        return settings
    return ReplicaSettings.from_mapping(settings)


def model_vocab_size(config: Any) -> int:
    """The MODEL's vocabulary size (embedding rows), not the tokenizer's length."""
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size is None and hasattr(config, "get_text_config"):
        vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise SettingsError(f"model: its config has no usable vocab_size ({vocab_size!r})")
    return vocab_size


def check_model_settings(settings: ReplicaSettings) -> int:
    """Fail fast, before any weights load, on a bad model or delimiter; returns vocab size."""
    try:
        source = resolve_model_source(settings.model.name)
        config = load_hf_config(source)
    except (ModelSourceError, OSError, ValueError) as error:
        raise SettingsError(f"model: cannot load {settings.model.name!r}: {error}") from error
    vocab_size = model_vocab_size(config)
    check_delimiter_in_vocab(settings.model, vocab_size, source.name)
    return vocab_size


def apply_user_config(current: ReplicaSettings, user_config: Mapping[str, Any]) -> ReplicaSettings:
    """New settings from ``user_config``; settings that need a model reload may not change."""
    changes: dict[str, Any] = {}
    for key, raw in user_config.items():
        if key not in ReplicaSettings.setting_names() or key in SECTIONS:
            raise SettingsError(f"{key}: unknown replica setting in user_config")
        value = tuple(raw) if isinstance(raw, list) else raw
        if value == current.value(key):
            continue
        if key not in RECONFIGURABLE:
            raise SettingsError(
                f"{key}: changing it needs a model reload; redeploy with new args "
                f"(user_config may change only {sorted(RECONFIGURABLE)})"
            )
        changes[key] = value
    return current.replace(**changes) if changes else current


def load_engine_factory(path: str) -> Callable[[ReplicaSettings], Any]:
    """``"module:Class"`` -> ``Class.from_settings`` (or the callable itself)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise SettingsError(f"engine_factory: expected 'module:attribute', got {path!r}")
    target = load_factory(path)
    return getattr(target, "from_settings", target)
