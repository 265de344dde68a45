"""Run as ``python -m tests.support.host_group_check PROCESS HOSTS PORT MODEL [REPEATS [bench]]`` in
each of HOSTS processes (``JAX_NUM_CPU_DEVICES`` devices each; HOSTS=1 runs without
jax.distributed). ``bench``: only the shared-prefix layout on [1, 4], timing one benchmark
request (the step overhead of a group against one process with the same devices).

Every process builds the same engines in the same order (shared-prefix, packed-reference and
single-item layouts on a ``[1, 4]`` mesh whose model axis crosses hosts; shared-prefix on a
``[2, 2]`` mesh whose data axis does) and scores the same works; process 0 prints one JSON
line with every layout's scores, and seconds per repeated ``score_batch``. The distributed
bootstrap must run before jax touches a device, hence separate processes.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from cluster.host_group import initialize_host
from replicas.contract import ScoreWork

MESHES = ((1, 4), (2, 2))
LAYOUTS = {
    "shared_prefix": {"multi_item_scoring_delimiter": 3},
    "packed_reference": {"multi_item_scoring_delimiter": 3, "layout": "packed_reference"},
    "single_item": {"multi_item_scoring_delimiter": None},
}


def works(vocab: int, bench: bool = False) -> list[ScoreWork]:
    """Two small requests; ``bench``: one benchmark request (300-token query, 10 items of 10)."""
    rng = np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(10, vocab, n))

    if bench:
        return [ScoreWork(ids(300), tuple(ids(10) for _ in range(10)), (5, 7, 9))]
    return [
        ScoreWork(ids(20), tuple(ids(n) for n in (5, 1, 7, 3)), (5, 7, 9)),
        ScoreWork(ids(9), tuple(ids(n) for n in (2, 6)), (4, 8)),
    ]


def run(model: str, repeats: int, bench: bool) -> dict:
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    out: dict = {}
    for mesh in MESHES[:1] if bench else MESHES:
        # Every layout with the model axis across hosts; the data axis needs only one.
        for name, overrides in list(LAYOUTS.items())[: 1 if bench or mesh != MESHES[0] else None]:
            settings = ReplicaSettings.from_keys(
                model=model,
                mesh_shape=mesh,
                batch_buckets=(1, 2),
                query_cache_bytes=0,  # every repeat computes its query
                **overrides,
            )
            engine = ScoringEngine.from_settings(settings, warm=False)
            batch = works(engine.info.vocab_size, bench)
            scores = engine.score_batch(batch)  # compiles
            start = time.perf_counter()
            for _ in range(repeats):
                engine.score_batch(batch)
            seconds = (time.perf_counter() - start) / max(repeats, 1)
            key = f"{mesh[0]}x{mesh[1]}/{name}"
            out[key] = {"scores": [s.tolist() for s in scores], "seconds": seconds}
    return out


def main(argv: list[str]) -> None:
    process, hosts, port, model = int(argv[0]), int(argv[1]), argv[2], argv[3]
    repeats = int(argv[4]) if len(argv) > 4 else 2
    bench = len(argv) > 5 and argv[5] == "bench"
    if hosts > 1:
        initialize_host(f"127.0.0.1:{port}", hosts, process, 120)
    import jax

    from replicas.engine.group_engine import check_mesh_spans_hosts
    from replicas.settings import ReplicaSettings, SettingsError

    try:  # a mesh that does not hold every device of every host is refused by name
        check_mesh_spans_hosts(
            ReplicaSettings.from_keys(mesh_shape=(1, 2), hosts_per_replica=hosts).placement
        )
        refused = ""
    except SettingsError as error:
        refused = str(error)
    result = {
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "refused": refused,
        **run(model, repeats, bench),
    }
    if process == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
