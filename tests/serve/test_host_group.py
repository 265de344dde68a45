"""Host groups on CPU: real processes, JAX_NUM_CPU_DEVICES=2 per host, gloo collectives.

1. Engine level (``tests/support/host_group_check.py`` in separate processes): 2 hosts x 2 devices
   score like 1 host x 4 devices for every layout with the model axis across hosts (mesh
   [1, 4]), and with the data axis across hosts ([2, 2], shared-prefix).
2. Serve level: the shipped serve_config.yaml with ``hosts_per_replica: 2``, ``mesh_shape:
   [1, 4]``, ``host_resources: {CPU: 0.5}`` and JAX_NUM_CPU_DEVICES=2 in its runtime env,
   deployed like ``serve run`` with the tiny Llama (SmolLM2 on two hosts was measured by
   hand, docs/cluster.md; CI spends its time on the group, not on loading weights): it
   answers over HTTP, equal to one process's single-item scores; concurrent requests batch;
   a second app's handle works; a follower killed under load ends every request with 200
   or 503 and the group comes back.
3. Start-up errors name the setting: a mesh that does not span the hosts' devices (checked
   in the 2-process run of 1.), and STRICT_SPREAD with more hosts than nodes (the builder).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from ray import serve

from app.builder import build_app
from cluster.config_variant import host_group_variant
from cluster.host_group import HostGroupError, check_placement_fits, free_port
from replicas.contract import ScoreWork
from replicas.settings import SettingsError
from tests.support.fp32 import assert_fp32_close
from tests.support.serve_support import (  # noqa: F401
    RAY_SERVE,
    ServeCluster,
    app_status,
    replica_stats,
    serve_cluster,
    wait_for,
)

pytestmark = [pytest.mark.slow, RAY_SERVE]
ROOT = Path(__file__).resolve().parents[2]
PARIS, LONDON, BERLIN = 7042, 4528, 11452
# A group's first request compiles its steps on both hosts (no warm-up, below): over 60 s on
# a slow CI machine, so the clients wait as long as a step that compiles may take.
FIRST_REQUEST_S = 300


def _check(process: int, hosts: int, port: int, model: Path, devices: int) -> subprocess.Popen:
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "tests.support.host_group_check", str(process), str(hosts)]
    return subprocess.Popen(
        [*argv, str(port), str(model)], env=env, stdout=subprocess.PIPE, text=True
    )


def _result(process: subprocess.Popen) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


@pytest.mark.deep
def test_two_hosts_of_two_devices_score_like_one_host_of_four(tiny_llama_dir: Path) -> None:
    port = free_port()
    group = [_check(p, 2, port, tiny_llama_dir, 2) for p in (1, 0)]
    alone = _check(0, 1, 0, tiny_llama_dir, 4)  # beside the group: each waits on its own
    two = _result(group[1])
    group[0].communicate(timeout=60)
    one = _result(alone)
    assert (two["devices"], two["processes"]) == (4, 2)
    assert "mesh_shape: [1, 2] holds 2 devices" in two["refused"]  # start-up names both
    assert "hosts_per_replica: 2 hosts x 2 devices per host = 4" in two["refused"]
    assert (one["devices"], one["processes"]) == (4, 1)
    keys = [key for key in one if "/" in key]
    assert len(keys) == 4  # 3 layouts with the model axis across hosts, 1 with data
    for key in keys:
        for got, want in zip(two[key]["scores"], one[key]["scores"], strict=True):
            # Gloo sums the model-axis partials in another order than one process does.
            assert_fp32_close(got, want, what=key)


def test_strict_spread_over_more_hosts_than_nodes_fails_naming_the_settings() -> None:
    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}]
    with pytest.raises(HostGroupError, match=r"hosts_per_replica: 2 .*STRICT_SPREAD"):
        check_placement_fits(2, {"CPU": 0.5}, "STRICT_SPREAD", nodes)
    check_placement_fits(2, {"CPU": 0.5}, "SPREAD", nodes)  # one machine holds both
    with pytest.raises(HostGroupError, match="host_resources"):
        check_placement_fits(2, {"TPU": 4}, "SPREAD", nodes)


# ----------------------------------------------------------------------------- Serve


def group_config(**args: Any) -> dict[str, Any]:
    """The shipped serve_config.yaml as a 2-host group of 2 CPU devices each (what
    ``python -m cluster.config_variant`` prints), with a small warm-up for CI."""
    config = host_group_variant(2, (1, 4), host_cpus=0.5, cpu_devices=2)
    (app,) = config["applications"]
    # No warm-up, of scoring or completions (11 steps of up to 2064 tokens compiled across
    # the two processes): the first request compiles its two steps (the suite's time budget).
    app["args"].update(
        warmup_shapes=[],
        completion_warmup_shapes=[],
        limit_to_warmup=False,
        compilation_cache_dir=None,
        host_timeout_s=60,
        **args,
    )
    for deployment in app["deployments"]:
        if deployment["name"] == "ScoreIngress":
            deployment["ray_actor_options"]["num_cpus"] = 0.1
            deployment["autoscaling_config"].update(min_replicas=1, max_replicas=1)
        else:
            deployment["health_check_period_s"] = 2  # a broken group is replaced sooner
    return config


@pytest.fixture(scope="module")
def group(serve_cluster: ServeCluster, tiny_llama_dir: Path) -> Iterator[ServeCluster]:  # noqa: F811
    serve_cluster.deploy_config(group_config(model=str(tiny_llama_dir)), "scorejax", "/health")
    yield serve_cluster


def score(http: httpx.Client, items: list[list[int]], query: list[int]) -> httpx.Response:
    body = {"query": query, "items": items, "label_token_ids": [PARIS, LONDON, BERLIN]}
    return http.post("/v1/score", json=body)


QUERY = [504, 3575, 282, 4649, 314]  # "The capital of France is"
ITEMS = [[7042], [4528, 30], [11452, 314, 260], [28, 29, 30, 31]]


def test_two_hosts_over_http_equal_one_process_single_item(
    group: ServeCluster, tiny_llama_dir: Path
) -> None:
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    with group.client(FIRST_REQUEST_S) as http:
        response = score(http, ITEMS, QUERY)
    assert response.status_code == 200, response.text
    settings = ReplicaSettings.from_keys(multi_item_scoring_delimiter=None)
    loaded = load_model(tiny_llama_dir, build_mesh((1, 1)))
    single = ScoringEngine(loaded.model, loaded.params, build_mesh((1, 1)), settings, "tiny")
    (reference,) = single.score_batch(
        [ScoreWork(tuple(QUERY), tuple(map(tuple, ITEMS)), (PARIS, LONDON, BERLIN))]
    )
    np.testing.assert_allclose(response.json()["scores"], np.exp(reference), rtol=1e-4)
    stats = replica_stats("scorejax")
    assert stats["hosts"] == 2
    counts = stats["host_compile_counts"]
    assert len(set(counts)) == 1 and counts[0] > 0  # every host compiled the same


def test_concurrent_requests_batch_across_the_group(group: ServeCluster) -> None:
    before = replica_stats("scorejax")["largest_batch"]
    with group.client(FIRST_REQUEST_S) as http:
        first = score(http, ITEMS[:2], QUERY).json()["scores"]
        results: list[httpx.Response] = []

        def call() -> None:
            results.append(score(http, ITEMS[:2], QUERY))

        threads = [threading.Thread(target=call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert [r.status_code for r in results] == [200] * 8
    for response in results:
        np.testing.assert_allclose(response.json()["scores"], first, rtol=1e-5)
    assert max(before, replica_stats("scorejax")["largest_batch"]) > 1


@serve.deployment(name="GroupCaller", ray_actor_options={"num_cpus": 0.1})
class GroupCaller:
    """A second application that scores through the group's app handle."""

    async def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await serve.get_app_handle("scorejax").score.remote(**payload)


def test_a_second_app_calls_the_group_through_its_handle(group: ServeCluster) -> None:
    group.deploy(GroupCaller.bind(), "caller", None)
    body = {"query": QUERY, "items": ITEMS[:1], "label_token_ids": [PARIS, LONDON]}
    result = serve.get_app_handle("caller").remote(body).result(timeout_s=120)
    assert len(result["scores"]) == 1 and len(result["scores"][0]) == 2
    serve.delete("caller")


def follower_pids() -> list[int]:
    """The follower hosts' process ids, from the group's stats ([] while none answers)."""
    try:
        members = replica_stats("scorejax")["host_members"]
    except Exception:  # the replica is being replaced
        return []
    return [member["pid"] for member in members if member["process"] > 0]


@pytest.mark.deep
def test_a_killed_follower_ends_every_request_and_the_group_comes_back(
    group: ServeCluster,
) -> None:
    (follower,) = follower_pids()
    codes: list[int] = []
    stop = threading.Event()
    with group.client(FIRST_REQUEST_S) as http:
        expected = score(http, ITEMS, QUERY).json()["scores"]

        def load() -> None:
            while not stop.is_set():
                codes.append(score(http, ITEMS, QUERY).status_code)

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        wait_for(lambda: len(codes) >= 4, 60, "load running")
        killed = time.monotonic()
        os.kill(follower, signal.SIGKILL)  # the host dies
        wait_for(lambda: 503 in codes, 120, "a 503 after the kill")
        wait_for(
            lambda: codes[-1] == 200 and follower_pids() not in ([], [follower]), 300, "recovery"
        )
        recovered = time.monotonic() - killed
        stop.set()
        for worker in workers:
            worker.join(timeout=180)
        after = score(http, ITEMS, QUERY)
    assert set(codes) <= {200, 503}, codes
    assert after.status_code == 200
    np.testing.assert_allclose(after.json()["scores"], expected, rtol=1e-5)
    print(f"follower killed: 200 again after {recovered:.1f} s; {codes.count(503)} x 503")


def test_the_builder_refuses_strict_spread_beyond_this_clusters_nodes(group: ServeCluster) -> None:
    (app,) = group_config(placement_group_strategy="STRICT_SPREAD")["applications"]
    with pytest.raises(SettingsError, match=r"hosts_per_replica: 2 .*STRICT_SPREAD"):
        build_app(app["args"])  # this Ray cluster has one node
