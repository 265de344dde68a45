"""The adapters section: LoRA adapters loaded at start-up and the slots every step is
compiled with (semantics 21, replicas/model/lora.py). Jax-free; each error starts with the
setting's name."""

from __future__ import annotations

from dataclasses import dataclass

from replicas.settings.common import SettingsError

MAX_LORA_RANK = 256


@dataclass(frozen=True)
class AdapterSettings:
    """LoRA adapters and their slots."""

    lora_adapters: tuple[tuple[str, str], ...] = ()
    """Name -> PEFT directory (adapter_config.json + adapter_model.safetensors), loaded at
    start-up; a request picks one by its ``model``. Needs max_loras >= their number."""
    max_loras: int = 0
    """Adapter slots every step is compiled with (0: LoRA off, steps compile as without it);
    loading an adapter into a free slot compiles nothing. Each slot costs every token
    M * r * (in + out) multiply-adds per projection (M = max_loras + 1, the base's slot)."""
    max_lora_rank: int = 16
    """The largest rank a slot holds; smaller adapters pad with zeros (exact)."""

    def __post_init__(self) -> None:
        try:
            check_lora_settings(self.lora_adapters, self.max_loras, self.max_lora_rank)
        except ValueError as error:
            raise SettingsError(str(error)) from error


def check_lora_settings(
    adapters: tuple[tuple[str, str], ...], max_loras: int, max_lora_rank: int
) -> None:
    """Raise ValueError naming the setting when the three do not make sense together."""
    if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 0:
        raise ValueError(f"max_loras: must be an int >= 0 (0 = LoRA off), got {max_loras!r}")
    if (
        isinstance(max_lora_rank, bool)
        or not isinstance(max_lora_rank, int)
        or not 1 <= max_lora_rank <= MAX_LORA_RANK
    ):
        raise ValueError(
            f"max_lora_rank: must be an int in [1, {MAX_LORA_RANK}], got {max_lora_rank!r}"
        )
    names = [name for name, _ in adapters]
    if any(not isinstance(name, str) or not name for name in names):
        raise ValueError(f"lora_adapters: names must be non-empty strings, got {names}")
    if any(not isinstance(path, str) or not path for _, path in adapters):
        raise ValueError(
            f"lora_adapters: each adapter needs a directory path, got {dict(adapters)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"lora_adapters: duplicate names in {names}")
    if len(adapters) > max_loras:
        raise ValueError(
            f"max_loras: {max_loras} slots cannot hold the {len(adapters)} lora_adapters "
            f"{names}; set max_loras >= {len(adapters)}"
        )
