"""Ray worker niceness (cluster/niceness.py): the start-up warning of a niced worker."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import niceness
from cluster.niceness import NICENESS_ENV, niceness_warning, warn_if_niced

ROOT = Path(__file__).resolve().parents[2]
RENICED = """
import json, os
from cluster.niceness import niceness_warning, worker_niceness
before = worker_niceness()
os.nice(3)
print(json.dumps([before, worker_niceness(), niceness_warning("scoring replica")]))
"""


def test_a_reniced_process_sees_its_niceness_and_is_told_the_setting() -> None:
    out = subprocess.run(
        [sys.executable, "-c", RENICED], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    before, after, warning = json.loads(out)
    assert after == min(before + 3, 19)  # Linux caps niceness at 19 (a suite run under nice)
    assert f"the scoring replica runs at niceness {after}" in warning
    assert f"{NICENESS_ENV}=0" in warning


def test_no_warning_at_niceness_zero(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(niceness, "worker_niceness", lambda: 0)
    assert niceness_warning("ingress") is None
    warn_if_niced("ingress", logging.getLogger("t"))
    assert caplog.records == []
    monkeypatch.setattr(niceness, "worker_niceness", lambda: 15)
    warn_if_niced("ingress", logging.getLogger("t"))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "the ingress runs at niceness 15" in caplog.text


COMPUTE_NICED = """
import json, os, threading
from cluster.niceness import start_compute_niced, thread_niceness

def start():
    import jax, jax.numpy as jnp
    x = jnp.ones((256, 256))
    jax.jit(lambda a: a @ a)(x).block_until_ready()

start_compute_niced(7, start)
import jax, jax.numpy as jnp
x = jnp.ones((512, 512))
step = jax.jit(lambda a: jnp.tanh(a @ a) @ a)
for _ in range(20):
    step(x).block_until_ready()
threads = {}
for tid in os.listdir("/proc/self/task"):
    comm = open(f"/proc/self/task/{tid}/comm").read().strip()
    threads.setdefault(comm, []).append(thread_niceness(int(tid)))
print(json.dumps({"caller": thread_niceness(threading.get_native_id()), "threads": threads}))
"""


def test_the_compute_threads_jax_starts_run_niced_and_the_caller_does_not() -> None:
    """The thread pools XLA starts with jax's CPU backend (its ``tf_XLAEigen`` workers do a
    step's matmuls) inherit the niceness of the thread that started the backend."""
    out = subprocess.run(
        [sys.executable, "-c", COMPUTE_NICED], cwd=ROOT, capture_output=True, text=True,
        check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    ).stdout  # fmt: skip
    found = json.loads(out)
    base, niced = found["caller"], max(found["caller"], 7)  # niceness 7 is absolute
    assert found["threads"]["tf_XLAEigen"] and set(found["threads"]["tf_XLAEigen"]) == {niced}
    assert niced in found["threads"]["python"]  # XLA's other pools, named after python
    assert base in found["threads"]["python"]  # the caller and Python's own threads
