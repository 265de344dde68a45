"""Typed settings of a scoring replica, in sections, built from serve_config.yaml's
args/user_config.

A config names each setting by its flat key (``max_batch_size: 16``), as it always has, or
groups them by section (``batching: {max_batch_size: 16}``); both forms load into the same
sections. Jax-free. Every error names the setting that is wrong, so a bad config fails at
start-up with a message a person can act on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from replicas.contract import Envelope, ScoringLimits
from replicas.settings.adapters import AdapterSettings
from replicas.settings.common import SettingsError, as_pairs, as_tuples
from replicas.settings.engine import EngineSettings
from replicas.settings.model import ModelSettings
from replicas.settings.placement import PlacementSettings
from replicas.settings.serving import BatchingSettings, HttpSettings
from replicas.settings.warmup import Shape, WarmupSettings, WarmupWorkload, derive_envelopes

# Section name -> its class, in the order a config's sections are built and checked.
SECTIONS: Mapping[str, type] = MappingProxyType(
    {
        "model": ModelSettings,
        "engine": EngineSettings,
        "warmup": WarmupSettings,
        "batching": BatchingSettings,
        "http": HttpSettings,
        "placement": PlacementSettings,
        "adapters": AdapterSettings,
    }
)
# Flat config keys whose field in their section is named otherwise.
RENAMED: Mapping[str, str] = MappingProxyType({"model": "name"})
# Keys a config may still carry from an earlier release -> what to write instead.
RETIRED: Mapping[str, str] = MappingProxyType(
    {"max_call_tokens": "replaced by max_call_s, the merged-call bound in seconds (shipped: 3)"}
)
PAIRS = ("host_resources", "host_label_selector", "rerank_template", "lora_adapters")


def _flat_keys() -> Mapping[str, tuple[str, str]]:
    keys: dict[str, tuple[str, str]] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            flat = next((k for k, v in RENAMED.items() if v == f.name), f.name)
            keys[flat] = (section, f.name)
    return MappingProxyType(keys)


FLAT_KEYS = _flat_keys()  # flat config key -> (section, field)
FLAT_KEY_OF = MappingProxyType({where: key for key, where in FLAT_KEYS.items()})


def _value(key: str, raw: Any) -> Any:
    """A flat setting's value as YAML gave it -> the section field's form."""
    if key == "warmup_workload" and isinstance(raw, Mapping):
        return WarmupWorkload.from_mapping(raw)
    return as_pairs(raw) if key in PAIRS else as_tuples(raw)


@dataclass(frozen=True)
class ReplicaSettings:
    """Everything a replica needs to load a model and serve scoring steps, by section; each
    layer reads its own: the engine ``engine`` (and ``warmup``), replica serving
    ``batching``, the ingress ``http``, placement code ``placement``, LoRA code ``adapters``."""

    model: ModelSettings = field(default_factory=ModelSettings)
    """Which weights, in what dtype; the multi-item delimiter; embedding pooling."""
    engine: EngineSettings = field(default_factory=EngineSettings)
    """Layouts, attention, buckets, compiling and caching."""
    warmup: WarmupSettings = field(default_factory=WarmupSettings)
    """What start-up compiles, and whether requests are limited to it."""
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    """Cross-request batching, merged calls, admission and deadlines."""
    http: HttpSettings = field(default_factory=HttpSettings)
    """Request limits, /v1/rerank's method, API keys."""
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    """Mesh, hosts and their Ray resources."""
    adapters: AdapterSettings = field(default_factory=AdapterSettings)
    """LoRA adapters and slots."""

    def __post_init__(self) -> None:
        """Checks that span sections (each section checks its own fields)."""
        longest = self.engine.longest_row
        for shape in self.warmup.completion_warmup_shapes:
            if shape[0] + shape[2] > longest:
                raise SettingsError(
                    f"completion_warmup_shapes: {list(shape)} holds prompts of "
                    f"{shape[0] + shape[2]} tokens, beyond the buckets' {longest}"
                )
        sizes, largest = self.warmup.warmup_batch_sizes, self.engine.batch_buckets[-1]
        if not sizes or not all(1 <= b <= largest for b in sizes):
            raise SettingsError(
                f"warmup_batch_sizes: each must be in [1, {largest}] "
                f"(the largest batch bucket), got {list(sizes)}"
            )
        if self.model.quantization == "int8_smooth" and self.adapters.max_loras:
            raise SettingsError(
                "quantization: int8_smooth folds its rescaling into the layers' inputs, which "
                "LoRA adapters read unscaled; with max_loras > 0 use int8 or int8_weight"
            )
        if self.warmup.limit_to_warmup and not self.warmup_shapes:
            raise SettingsError(
                "limit_to_warmup: needs warmup_shapes (the shapes it limits to) or warmup_workload"
            )
        try:
            self.limits  # noqa: B018 (validates)
        except ValueError as error:
            raise SettingsError(str(error)) from error

    @property
    def warmup_shapes(self) -> tuple[Shape, ...]:
        """The warm-up envelopes in force: ``warmup_shapes`` where set, else those
        ``warmup_workload`` derives (with the engine's ``item_tokens_per_step``), else none."""
        written, workload = self.warmup.warmup_shapes, self.warmup.warmup_workload
        if written is not None or workload is None:
            return written or ()
        return derive_envelopes(workload, self.engine.item_tokens_per_step)

    @property
    def limits(self) -> ScoringLimits:
        """The request limits; a query, an item or a single-item row is at most one bucket
        (with ``limit_to_warmup``, within one warm-up envelope too)."""
        limit = self.warmup.limit_to_warmup
        envelopes = tuple(
            Envelope(query, item_tokens, labels)
            for query, _, item_tokens, labels in (self.warmup_shapes if limit else ())
        )
        prompts = [prefix + after for prefix, _, after, _ in self.warmup.completion_warmup_shapes]
        return ScoringLimits(
            self.http.max_items_per_request,
            self.http.max_multi_item_seq_len,
            self.engine.longest_row,
            envelopes,
            self.http.max_request_tokens,
            max(prompts) if limit and prompts else None,
        )

    @staticmethod
    def setting_names() -> frozenset[str]:
        """Every key a config's ``args`` may hold: the flat keys and the section names."""
        return frozenset(FLAT_KEYS) | frozenset(SECTIONS)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ReplicaSettings:
        """Build from YAML-ish values, flat keys or sections (``batching: {...}``) or both;
        an unknown key is an error naming the key."""
        sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}

        def put(flat: str, raw: Any) -> None:
            section, name = FLAT_KEYS[flat]
            if name in sections[section]:
                raise SettingsError(f"{flat}: set twice (flat and in section {section})")
            sections[section][name] = _value(flat, raw)

        for key, raw in values.items():
            if key in SECTIONS and (key != "model" or isinstance(raw, Mapping)):
                if not isinstance(raw, Mapping):
                    raise SettingsError(f"{key}: a section, expected a mapping, got {raw!r}")
                names = sorted(f.name for f in dataclasses.fields(SECTIONS[key]))
                for name, value in raw.items():
                    if name not in names:
                        raise SettingsError(f"{key}.{name}: unknown {key} setting (known: {names})")
                    put(FLAT_KEY_OF[key, name], value)
            elif key in FLAT_KEYS:
                put(key, raw)
            elif key in RETIRED:
                raise SettingsError(f"{key}: {RETIRED[key]}")
            else:
                raise SettingsError(f"{key}: unknown replica setting (known: {sorted(FLAT_KEYS)})")
        return cls(**{name: SECTIONS[name](**given) for name, given in sections.items()})

    @classmethod
    def from_keys(cls, **values: Any) -> ReplicaSettings:
        """``from_mapping`` of keyword arguments: ``ReplicaSettings.from_keys(model=...)``."""
        return cls.from_mapping(values)

    def value(self, key: str) -> Any:
        """The value of the setting a flat config key names."""
        if key not in FLAT_KEYS:
            raise SettingsError(f"{key}: unknown replica setting")
        section, name = FLAT_KEYS[key]
        return getattr(getattr(self, section), name)

    def replace(self, **changes: Any) -> ReplicaSettings:
        """These settings with some changed, by flat key (``max_batch_size=4``) or by whole
        section (``batching=BatchingSettings(...)``); every check runs again."""
        whole = {k: v for k, v in changes.items() if k in SECTIONS and isinstance(v, SECTIONS[k])}
        by_section: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            if key in whole:
                continue
            if key not in FLAT_KEYS:
                raise SettingsError(f"{key}: unknown replica setting")
            section, name = FLAT_KEYS[key]
            by_section.setdefault(section, {})[name] = value
        for section, fields in by_section.items():
            whole[section] = dataclasses.replace(
                whole.get(section, getattr(self, section)), **fields
            )
        return dataclasses.replace(self, **whole)
