"""Run as ``python -m tests.support.batch_nodes_check CONFIG INPUT OUTPUT MARKERS`` (from
tests/batch/test_batch_nodes.py): a ``score`` job on a 2-node local Ray cluster
(``ray.cluster_utils.Cluster``) whose worker node holding an engine actor is lost mid-job.

Each node has room for one engine actor (its one ``engine_host``; 4 CPUs, the engine takes
2), so ``--replicas 2`` puts one on each. The engines are
``tests.support.batch_fault_engine:HeldEngine``: the one off the head node holds its first batch
unscored; once it does and the head's engine has scored a batch, this script removes its
node (``Cluster.remove_node``, no graceful stop), a replacement node joins, and the job runs on.
Writes ``MARKERS/report.json``: the head and victim nodes, the batches scored before the kill and by
which node each batch was scored, and the job's summary. Its own process, since a
``Cluster`` cannot be joined by a process connected to another Ray cluster (the suite's).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.batch_fault_engine import HEAD_ENV, HOLD_ENV, write_json
from tests.support.serve_support import NODE_ENV, wait_for, worker_env

ROOT = Path(__file__).resolve().parents[2]
ENGINE_HOST = "engine_host"  # a custom resource: one a node (test_batch_nodes.config_file)
LABELS = (7042, 4528, 11452)
# One engine actor a node (each holds the node's one ``engine_host``) and two CPUs beside it:
# with three CPUs a node and no such resource, the hash shuffle's reduce tasks (grouping,
# issue 46) once found no CPU budget left beside the two engine actors and the job stalled
# (an AVX2 suite run, 2026-11-26: "timed out ... waiting for an engine to hold a batch").
NODE = {"num_cpus": 4, "resources": {ENGINE_HOST: 1}, "object_store_memory": 80 * 1024**2}
# Ray notices a lost node within about a second (defaults: about 15 s), and starts no idle
# workers ahead of time (each is a Python process importing Ray, on a machine of 2 cores).
SYSTEM_CONFIG = {
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
    # An idle worker is kept a minute, not a second (as the session's cluster,
    # tests/serve_support.py): the job's read, shuffle and write tasks come in waves, and
    # each worker Ray starts again is a Python process importing Ray.
    "idle_worker_killing_time_threshold_ms": 60_000,
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_failure_threshold": 3,
    # As make serve starts Ray: at Ray's default (15) the suite's niced background compiles
    # would take the workers' CPU first (cluster/niceness.py).
    "worker_niceness": 0,
}


def scored(markers: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(markers.glob("scored-*.json"))]


def start(cluster: Any) -> None:
    """Connect as the job's driver; its workers get ``worker_env`` through the job's
    ``runtime_env`` (docs/testing.md: inheriting it instead measured no gain here)."""
    import ray

    runtime_env = {"env_vars": worker_env()}
    ray.init(address=cluster.address, log_to_driver=False, runtime_env=runtime_env)


def run_job(config: Path, source: Path, output: Path, markers: Path, head: str) -> Any:
    import ray.data

    from batch.pipeline import EngineOptions, run_score_job, settings_from_config
    from batch.rows import ScoreColumns

    options = EngineOptions(
        replicas=2,
        batch_size=2,
        block_rows=1,  # 16 shuffled blocks: each of the four group keys in a block of its own
        engine_factory="tests.support.batch_fault_engine:HeldEngine",
        engine_env=((HOLD_ENV, str(markers)), (HEAD_ENV, head)),
    )
    # Both engine actors up before any block is dispatched, and blocks to the least loaded
    # actor, not the one beside the shuffle's output (on the head node): each gets a block.
    context = ray.data.DataContext.get_current()
    context.wait_for_min_actors_s = 300
    context.execution_options.actor_locality_enabled = False
    settings = settings_from_config(config)
    return run_score_job(str(source), str(output), settings, ScoreColumns(LABELS), options, "jsonl")


def main(argv: list[str]) -> int:
    import ray
    from ray.cluster_utils import Cluster

    config, source, output, markers = (Path(a) for a in argv[:4])
    # No usage statistics (nothing leaves this machine anyway): Ray Data then starts no
    # usage-collection actor, a worker process of its own.
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.update(NODE_ENV)  # the nodes' dashboard agents (tests/support/serve_support.py)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODE, "include_dashboard": False, "_system_config": SYSTEM_CONFIG},
    )
    try:
        # Ray's log monitor forwards worker logs to a driver; log_to_driver is off (as the
        # session's cluster, tests/serve_support.py).
        cluster.head_node.kill_log_monitor()
        worker = cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        start(cluster)
        head = ray.get_runtime_context().get_node_id()
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(run_job, config, source, output, markers, head)
            wait_for(lambda: (markers / "held").exists(), 300, "an engine to hold a batch")
            wait_for(lambda: scored(markers), 300, "the head's engine to score a batch")
            held = json.loads((markers / "held").read_text())
            before = scored(markers)
            assert held["node"] == worker.node_id, (held, worker.node_id)
            cluster.remove_node(worker, allow_graceful=False)
            cluster.add_node(**NODE)
            summary = job.result(timeout=420)
        report = {
            "head": head,
            "held": held,
            "scored_before_kill": before,
            "scored": scored(markers),
            "summary": summary.as_dict(),
        }
        write_json(markers / "report.json", report)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
