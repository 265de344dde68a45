"""The XLA flags the test suite compiles CPU steps with (set by conftest.py for the whole
session and every process it starts); production code never sets them."""

from __future__ import annotations

# LLVM -O0 for XLA's CPU code generation: steps compile about twice as fast.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0",)


def with_test_xla_flags(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with the test flags added once."""
    present = flags.split()
    return " ".join([*present, *(f for f in TEST_XLA_FLAGS if f not in present)])


def without_test_xla_flags(flags: str) -> str:
    """``flags`` less the test flags: what a production process would run with."""
    return " ".join(f for f in flags.split() if f not in TEST_XLA_FLAGS)
