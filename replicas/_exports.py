"""Lazy public names for the subpackages of ``replicas`` (PEP 562).

A subpackage's ``__init__`` names its public surface without importing it: the CPU ingress
imports jax-free modules such as ``replicas.checkpoints.sources`` or
``replicas.serving.deployment``, and an eager ``__init__`` would pull jax in with them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: name -> the submodule (relative) defining it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
