"""Ray worker niceness (cluster/niceness.py): the start-up warning of a niced worker."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import niceness
from cluster.niceness import NICENESS_ENV, niceness_warning, warn_if_niced

ROOT = Path(__file__).resolve().parents[1]
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
    assert after == before + 3
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
