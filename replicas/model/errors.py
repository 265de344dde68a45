"""The error every model-config parser raises (``config`` and ``families`` share it)."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or a config field is not supported."""
