"""Rerank prompt templates from the ``rerank_template`` setting, checked at start-up."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TypeVar

from replicas.settings import SettingsError

T = TypeVar("T")


def template_from_pairs(
    cls: type[T], pairs: Sequence[tuple[str, str]], slots: Mapping[str, str], method: str
) -> T:
    """``cls`` (a dataclass of prompt parts) from ``pairs``; an unknown key, or a part in
    ``slots`` without its placeholder, stops start-up naming ``rerank_template``."""
    values = dict(pairs)
    known = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise SettingsError(
            f"rerank_template: unknown key {unknown[0]!r} for rerank_method {method} "
            f"(known: {sorted(known)})"
        )
    template = cls(**values)
    for field, needed in slots.items():
        if needed not in getattr(template, field):
            raise SettingsError(f"rerank_template.{field}: must contain {needed}")
    return template
