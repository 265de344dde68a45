"""Infinity (``infinity-emb``) on a job of the encoder benchmark, run by Infinity's own
interpreter (``make bench-infinity`` installs it in .venv-infinity: it pins numpy < 2 and
sentence-transformers < 4, so it cannot share scorejax's venv). Imports nothing of scorejax.

    .venv-infinity/bin/python loadtest/infinity_runner.py JOB.json OUT.json

JOB: ``{"model": DIR, "kind": "embed", "texts": [...]}`` or ``{"model": DIR, "kind":
"rerank", "query": Q, "docs": [...]}``, and ``"batch_size"``. OUT: ``{"seconds": wall
seconds of the timed call, "outputs": the vectors or scores in input order, "version"}``.
Infinity's torch engine on the CPU, its default batching (requests queued, sorted by length,
batches of ``batch_size``), one untimed call first.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time


async def run(job: dict) -> dict:
    from infinity_emb import AsyncEngineArray, EngineArgs, __version__

    args = EngineArgs(
        model_name_or_path=job["model"], engine="torch", device="cpu",
        batch_size=job["batch_size"], model_warmup=False, bettertransformer=False,
    )  # fmt: skip
    (engine,) = AsyncEngineArray.from_args([args])
    async with engine:
        if job["kind"] == "embed":
            await engine.embed(sentences=job["texts"][:8])
            start = time.perf_counter()
            vectors, _ = await engine.embed(sentences=job["texts"])
            seconds = time.perf_counter() - start
            outputs = [[float(x) for x in vector] for vector in vectors]
        else:
            await engine.rerank(query=job["query"], docs=job["docs"][:8], raw_scores=False)
            start = time.perf_counter()
            ranked, _ = await engine.rerank(query=job["query"], docs=job["docs"], raw_scores=False)
            seconds = time.perf_counter() - start
            outputs = [float(r.relevance_score) for r in sorted(ranked, key=lambda r: r.index)]
    return {"seconds": seconds, "outputs": outputs, "version": __version__}


def main() -> None:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")
    torch.set_num_threads(os.cpu_count() or 1)
    job_path, out_path = sys.argv[1:3]
    with open(job_path) as f:
        job = json.load(f)
    result = asyncio.run(run(job))
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
