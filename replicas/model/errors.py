"""The errors the model-config parsers raise (``config``, ``head_config`` and the family
files share them)."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or a config field is not supported."""


class UnsupportedHeadError(ValueError):
    """The config's head fields are unusable (they are named in the message)."""
