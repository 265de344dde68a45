"""Run as ``python -m tests.host_group_check PROCESS HOSTS PORT MODEL_DIR`` in each of HOSTS
processes (``JAX_NUM_CPU_DEVICES`` devices each; HOSTS=1 runs without jax.distributed).

Every process builds the same engines in the same order (shared-prefix, packed-reference and
single-item layouts, on a ``[1, 4]`` mesh whose model axis crosses hosts and a ``[2, 2]`` mesh
whose data axis does) and scores the same works; process 0 prints one JSON line with every
layout's scores, and seconds per repeated ``score_batch``. The distributed bootstrap must run
before jax touches a device, hence separate processes.
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


def works(vocab: int) -> list[ScoreWork]:
    rng = np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(10, vocab, n))

    return [
        ScoreWork(ids(20), tuple(ids(n) for n in (5, 1, 7, 3)), (5, 7, 9)),
        ScoreWork(ids(9), tuple(ids(n) for n in (2, 6)), (4, 8)),
    ]


def run(model: str, repeats: int) -> dict:
    from replicas.engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    out: dict = {}
    for mesh in MESHES:
        for name, overrides in LAYOUTS.items():
            settings = ReplicaSettings(
                model=model, mesh_shape=mesh, batch_buckets=(1, 2), **overrides
            )
            engine = ScoringEngine.from_settings(settings, warm=False)
            batch = works(engine.info.vocab_size)
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
    if hosts > 1:
        initialize_host(f"127.0.0.1:{port}", hosts, process, 120)
    import jax

    result = {
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        **run(model, repeats),
    }
    if process == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
