"""A ``score`` job that loses an engine actor's node mid-job, on a 2-node local Ray cluster.

tests/support/batch_nodes_check.py runs the job in its own process (a ``ray.cluster_utils.Cluster``:
a head and a worker node, one engine actor of the tiny Llama on each); the worker node is
removed while its engine holds an unscored batch and the head's engine has scored one, and a
replacement node joins. Ray Data restarts the actor there and retries its batches: the
output holds every id exactly once, each row as /v1/score answers it (the route's code on the
same settings, ``tests.batch.test_batch.expected``). A plain module, so it runs before the session's
Ray cluster starts (conftest.py): one Ray cluster on the machine at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.batch.test_batch import (  # noqa: F401 (``expected``: a fixture of this module too)
    assert_rows_equal,
    expected,
    expected_of,
    text_rows,
    tiny_config,
    written_rows,
)
from tests.support.batch_nodes_check import ENGINE_HOST

pytestmark = [pytest.mark.slow, pytest.mark.deep]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config_file(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/batch/test_batch.py's tiny config with two CPUs and the node's one ``engine_host`` per
    engine actor: a node of the 2-node cluster (4 CPUs) holds one engine actor and the light
    tasks beside it."""
    config = tiny_config(tiny_llama_dir)
    config["applications"][0]["args"]["host_resources"] = {"CPU": 2.0, ENGINE_HOST: 1.0}
    path = tmp_path_factory.mktemp("batch-nodes-config") / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_job_that_loses_an_engine_node_writes_every_id_once_as_v1_score_answers(
    config_file: Path,
    expected: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    source, out, markers = tmp_path / "rows", tmp_path / "out", tmp_path / "markers"
    source.mkdir()
    markers.mkdir()
    text = text_rows()
    for n in range(0, len(text), 2):  # files of two rows: one block and one engine call each
        lines = "".join(json.dumps(row) + "\n" for row in text[n : n + 2])
        (source / f"part-{n:02}.jsonl").write_text(lines)
    argv = [sys.executable, "-m", "tests.support.batch_nodes_check"]
    argv += [str(config_file), str(source), str(out), str(markers)]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-6000:]
    report = json.loads((markers / "report.json").read_text())

    victim = report["held"]["node"]
    assert victim != report["head"], "the held batch was on the worker node"
    before = report["scored_before_kill"]
    assert before and {b["node"] for b in before} == {report["head"]}, "some rows scored first"
    assert victim not in {b["node"] for b in report["scored"]}, "the lost node returned nothing"
    assert report["summary"]["rows"] >= len(text)
    assert_rows_equal(written_rows(out), expected_of(text, expected))  # every id exactly once
