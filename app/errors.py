"""The ingress's admission gate type. The error every rejected request gets, and its reasons,
are ``replicas.errors``' ``ScoringError`` and ``Reason`` (one class on both sides of the
handle)."""

from __future__ import annotations

from collections.abc import Callable

# The admission verdict: raises ScoringError (503 overloaded) to refuse a request. It
# runs after the body's schema checks and before tokenization (a refusal costs no more).
Gate = Callable[[], None]


def admit_all() -> None:
    """The gate of a service without admission control."""
