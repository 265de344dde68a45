"""Slice-pinned host groups on fake TPU slices (``ray.cluster_utils.Cluster``, CPU only).

Each fake TPU node starts its raylet with the environment GKE gives a TPU VM (``TPU_NAME``,
``TPU_WORKER_ID``, ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``) and ``{TPU: 4}``; Ray derives
from it the labels its slice placement reads (``ray.io/tpu-slice-name``,
``ray.io/tpu-worker-id``, ``ray.io/tpu-pod-type``) and worker 0's head resource
(``TPU-v5p-16-head``). Two v5p:2x2x2 slices of two hosts each: each group's hosts share one
slice name, a second group takes the other slice, a third waits and is never split, and
takes the slice the first gives back.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from app.builder import replica_placement
from cluster.slice_group import SliceGroup, TpuSlice, reserve_slice, slice_names
from replicas.contract import ScoreWork
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.fp32 import assert_fp32_close

pytestmark = [pytest.mark.slow, pytest.mark.deep]
TPU_ENV = ("TPU_NAME", "TPU_WORKER_ID", "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY")
BUNDLE = {"TPU": 4, "CPU": 1}
SLICE = "v5p:2x2x2"  # 8 chips: 2 hosts of 4 (pod type v5p-16: Ray counts 2 cores per chip)
SETTINGS = ReplicaSettings.from_keys(
    hosts_per_replica=2, mesh_shape=(1, 8), host_resources=tuple(BUNDLE.items()), tpu_slice=SLICE
)


def add_tpu_host(cluster: Cluster, slice_name: str, worker: int) -> None:
    saved = {key: os.environ.get(key) for key in TPU_ENV}
    os.environ.update(TPU_NAME=slice_name, TPU_WORKER_ID=str(worker))
    os.environ.update(TPU_ACCELERATOR_TYPE="v5p-16", TPU_TOPOLOGY="2x2x2")
    try:
        cluster.add_node(num_cpus=1, resources={"TPU": 4})
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def two_slices() -> Iterator[Cluster]:
    assert not ray.is_initialized()
    # Workers at niceness 0, as make serve starts Ray: at Ray's default (15) the suite's
    # niced background compiles would take their CPU first (cluster/niceness.py).
    head = {"num_cpus": 2, "include_dashboard": False, "_system_config": {"worker_niceness": 0}}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for name in ("slice-a", "slice-b"):
            for worker in (0, 1):
                add_tpu_host(cluster, name, worker)
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_fake_tpu_hosts_carry_the_labels_ray_reads(two_slices: Cluster) -> None:
    tpu = [n for n in ray.nodes() if n["Resources"].get("TPU")]
    labels = sorted(
        (n["Labels"]["ray.io/tpu-slice-name"], n["Labels"]["ray.io/tpu-worker-id"]) for n in tpu
    )
    assert labels == [("slice-a", "0"), ("slice-a", "1"), ("slice-b", "0"), ("slice-b", "1")]
    heads = [n for n in tpu if n["Resources"].get("TPU-v5p-16-head")]
    assert sorted(n["Labels"]["ray.io/tpu-worker-id"] for n in heads) == ["0", "0"]


def test_groups_take_whole_slices_and_a_third_waits_for_one(two_slices: Cluster) -> None:
    tpu_slice = TpuSlice.parse(SLICE)
    first, second = (reserve_slice(tpu_slice, BUNDLE, poll_s=2) for _ in range(2))
    names = [slice_names(first.placement_group), slice_names(second.placement_group)]
    assert {tuple(n) for n in names} == {("slice-a", "slice-a"), ("slice-b", "slice-b")}

    third: list = []
    waiting = threading.Thread(target=lambda: third.append(reserve_slice(tpu_slice, BUNDLE, 1)))
    waiting.start()
    waiting.join(timeout=5)
    assert waiting.is_alive() and not third  # every slice is taken: it waits, takes no part
    free = names[0][0]
    first.shutdown()
    waiting.join(timeout=60)
    assert third, "the third group never got the slice the first gave back"
    assert slice_names(third[0].placement_group) == [free, free]
    second.shutdown()
    third[0].shutdown()


def test_a_slice_groups_leader_finds_its_hosts_in_its_slice(two_slices: Cluster) -> None:
    group = SliceGroup.start(SLICE, BUNDLE, "tests.support.slice_target:HostProbe", SETTINGS, 60)
    try:
        hosts = group.call("slices")
        assert len(hosts) == 2 and len(set(hosts)) == 1 and hosts[0] in ("slice-a", "slice-b")
        assert slice_names(group.placement_group) == hosts
    finally:
        group.shutdown()


def test_a_slice_engine_scores_over_both_hosts_of_one_slice(
    two_slices: Cluster, tiny_llama_dir: Path
) -> None:
    """The replica's engine with ``tpu_slice``: a GroupEngine on the slice's two hosts (one
    CPU device each, gloo collectives; the model axis across them) scores like one process."""
    from cluster.mesh import build_mesh
    from replicas.checkpoints.loading import load_model
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.engine.slice_engine import SliceEngine

    settings = SETTINGS.replace(model=str(tiny_llama_dir), mesh_shape=(1, 2))
    work = ScoreWork((5, 9, 14, 20, 7), ((11, 12), (13,), (40, 41, 42)), (4, 8, 15))
    engine = SliceEngine.from_settings(settings)
    try:
        (scores,) = engine.score_batch([work])
        stats = engine.stats()
        engine.check_health()
    finally:
        engine.close()
    loaded = load_model(tiny_llama_dir, build_mesh((1, 1)))
    single = ScoringEngine(loaded.model, loaded.params, build_mesh((1, 1)), settings, "one")
    (reference,) = single.score_batch([work])
    assert_fp32_close(scores, reference)
    assert stats.hosts == 2 and len(set(stats.tpu_slice)) == 1


def test_serve_reserves_no_placement_group_for_a_slice_replica() -> None:
    placement = replica_placement(SETTINGS)
    assert placement == {"ray_actor_options": {"num_cpus": 0.25}}
    plain = replica_placement(SETTINGS.replace(tpu_slice=None))
    assert plain["placement_group_bundles"] == [BUNDLE, BUNDLE]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tpu_slice": "v5p-16"}, "tpu_slice: expected generation:topology"),
        ({"host_resources": (("CPU", 1),)}, "needs host_resources with TPU chips"),
        ({"hosts_per_replica": 4}, "slice is 2 host(s) of host_resources TPU 4"),
    ],
)
def test_a_bad_tpu_slice_names_the_settings(changes: dict, message: str) -> None:
    values = {"hosts_per_replica": 2, "host_resources": tuple(BUNDLE.items()), "tpu_slice": SLICE}
    with pytest.raises(SettingsError, match=re.escape(message)):
        ReplicaSettings.from_keys(**(values | changes))
