"""Checks of the LoRA settings (``ReplicaSettings.lora_adapters``, ``max_loras``,
``max_lora_rank``), jax-free; each error starts with the setting's name."""

from __future__ import annotations

MAX_LORA_RANK = 256


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
