"""What every settings section shares: the error, and the checks and conversions of values
as YAML gives them. Jax-free."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SettingsError(ValueError):
    """A replica setting is wrong; the message starts with the setting's name."""


def bucket_ladder(low: int, high: int, ratio: float = 1.125, align: int = 16) -> tuple[int, ...]:
    """Buckets from ``low`` to ``high``, each about ``ratio`` times the one before, multiples
    of ``align`` (so any size pads by at most ~``ratio``, and few shapes exist)."""
    ladder = [low]
    while ladder[-1] < high:
        grown = round(ladder[-1] * ratio / align) * align
        ladder.append(min(max(grown, ladder[-1] + align), high))
    return tuple(ladder)


def check_buckets(name: str, buckets: tuple[int, ...]) -> None:
    """Raise naming ``name`` unless ``buckets`` are strictly increasing positive ints."""
    if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise SettingsError(f"{name}: must be strictly increasing positive ints, got {buckets}")


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise SettingsError(f"{name}: must be one of {choices}, got {value!r}")


def check_at_least(name: str, value: Any, low: int, note: str = "") -> None:
    """Raise naming ``name`` when ``value`` is below ``low`` or NaN (``note``: what ``low``
    means)."""
    if not value >= low:
        raise SettingsError(f"{name}: must be >= {low}{note}, got {value}")


def as_tuples(value: Any) -> Any:
    """YAML lists (also nested) -> tuples, so settings stay hashable and frozen."""
    return tuple(as_tuples(v) for v in value) if isinstance(value, list) else value


def as_pairs(value: Any) -> Any:
    """A YAML mapping -> its sorted (key, value) pairs (a frozen setting's form); else as is."""
    return tuple(sorted(value.items())) if isinstance(value, Mapping) else value
