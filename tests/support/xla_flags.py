"""How the test suite compiles: the XLA flags and the run's own compilation cache (set by
conftest.py for the whole session and every process it starts); production code never sets
either."""

from __future__ import annotations

from collections.abc import Mapping

# LLVM -O0 for XLA's CPU code generation, and XLA's older elemental emitters in place of the
# MLIR fusion emitters: each about halves a step's compile time (docs/testing.md).
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
# jax reads these at start-up: a persistent compilation cache that this run alone fills (a
# new empty folder per session), every compile kept, so the Serve replicas, host-group
# processes and restarts of the run compile a step the run compiled before only once.
CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
CACHE_ENV_DEFAULTS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}


def with_test_xla_flags(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with the test flags added once."""
    present = flags.split()
    return " ".join([*present, *(f for f in TEST_XLA_FLAGS if f not in present)])


def without_test_xla_flags(flags: str) -> str:
    """``flags`` less the test flags: what a production process would run with."""
    return " ".join(f for f in flags.split() if f not in TEST_XLA_FLAGS)


def session_env(env: Mapping[str, str], cache_dir: str) -> dict[str, str]:
    """``env`` as the suite's processes get it: the test flags, and the run's cache."""
    return {
        **env,
        "XLA_FLAGS": with_test_xla_flags(env.get("XLA_FLAGS", "")),
        CACHE_DIR_ENV: cache_dir,
        **CACHE_ENV_DEFAULTS,
    }


def production_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the suite's compile settings: how a user's process compiles."""
    kept = {k: v for k, v in env.items() if k != CACHE_DIR_ENV and k not in CACHE_ENV_DEFAULTS}
    return kept | {"XLA_FLAGS": without_test_xla_flags(env.get("XLA_FLAGS", ""))}
