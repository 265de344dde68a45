"""A served encoder against sentence-transformers in process (issue 80; docs/benchmarks.md,
"A served encoder at real lengths"): an encoder of a real shape (loadtest.encoder_models,
``--shape``, random weights) embeds ``--texts`` texts of ``--min-words``..``--max-words``
words, served by the shipped app (serve_config.yaml, only ``model`` changed; a private Ray
cluster, loadtest.bench_batch_serve.served_app) as requests of ``--per-request`` texts,
``--concurrency`` in flight, beside sentence-transformers' ``encode(batch_size=per-request)``
and the engine in this process on the same texts: every request's work in one
``score_batch`` (what one engine call of the merged requests runs) and one call a request.
Medians of ``--rounds`` rounds that run every path once in turn, after untimed rounds (two,
then more until one compiles nothing in the background, five at most).

Where the served time goes: the replica's counters (``/v1/stats``: engine calls, steps,
engine seconds, computed / useful tokens) over the timed rounds, each response's timing
headers (tokenization, queue, inference, the ingress's total) and what is left of the
client's seconds outside the ingress (the proxy and the HTTP hop).

    python -m loadtest run encoder_served [--shape minilm] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from loadtest import peers
from loadtest.bench_embed import input_bodies
from loadtest.client import header_seconds
from loadtest.encoder_models import SHAPES, save_embedder, text_of
from loadtest.harness import (
    JSON_HEADERS,
    Option,
    Result,
    Run,
    Workload,
    col,
    table,
    timed_together,
)

HEADERS = ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time")
WARM_ROUNDS = 5  # untimed rounds at most: 2, then more until one compiles nothing
COUNTED = ("batches", "works", "steps", "engine_seconds", "computed_tokens", "useful_tokens",
           "background_compiles", "request_path_compiles")  # fmt: skip


class TimedClient:
    """``concurrency`` threads posting bodies to ``route``, each 503 sent again after its
    Retry-After; ``post`` and ``run`` return every 200's seconds and timing headers (``last``:
    the last 200)."""

    def __init__(self, url: str, route: str, concurrency: int) -> None:
        import httpx

        self._url, self._concurrency = f"{url}{route}", concurrency
        limits = httpx.Limits(max_connections=concurrency)
        self._client = httpx.Client(timeout=600.0, limits=limits)
        self.retried, self.last = 0, None

    def close(self) -> None:
        self._client.close()

    def post(self, body: bytes) -> dict[str, float]:
        while True:
            start = time.perf_counter()
            response = self._client.post(self._url, content=body, headers=JSON_HEADERS)
            seconds = time.perf_counter() - start
            if response.status_code == 200:
                self.last = response
                sample = {h: header_seconds(response.headers.get(h)) or 0.0 for h in HEADERS}
                return sample | {"client": seconds}
            if response.status_code != 503:
                raise RuntimeError(f"{self._url}: HTTP {response.status_code} {response.text}")
            self.retried += 1
            time.sleep(float(response.headers.get("retry-after", 1)))

    def run(self, bodies: list[bytes]) -> list[dict[str, float]]:
        with ThreadPoolExecutor(self._concurrency) as pool:
            return list(pool.map(self.post, bodies))


def corpus(o: argparse.Namespace) -> list[str]:
    rng = np.random.default_rng(0)
    counts = rng.integers(o.min_words, o.max_words + 1, o.texts)
    return [text_of(rng, int(n), SHAPES[o.shape]) for n in counts]


def measure_paths(o: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    from app.service import ScoringService
    from loadtest.bench_batch_serve import served_app, stats
    from loadtest.bench_common import settings_for
    from replicas.engine.scoring_engine import ScoringEngine

    shape = SHAPES[o.shape]
    model_dir = save_embedder(work_dir / "embedder", shape, o.layers or shape.layers)
    texts = corpus(o)
    groups = [texts[i : i + o.per_request] for i in range(0, len(texts), o.per_request)]
    settings = settings_for(model_dir, work_dir)
    service = ScoringService.from_settings(settings)
    works = [service.embedder.text_work(group, None) for group in groups]
    engine = ScoringEngine.from_settings(settings)
    st = peers.st_encode(model_dir, texts, o.per_request)
    bodies = input_bodies(texts, o.per_request)
    headers: list[dict[str, float]] = []
    with served_app(o.port, model=str(model_dir)) as url:
        client = TimedClient(url, "/v1/embeddings", o.concurrency)
        calls = {
            "served": lambda: headers.extend(client.run(bodies)),
            "engine": lambda: engine.score_batch(works),
            "engine_each": lambda: [engine.score_batch([work])[0] for work in works],
            "st": st,
        }
        engine_stats = lambda: {f"engine {k}": v for k, v in engine.stats().as_dict().items()}  # noqa: E731
        try:
            for n in range(WARM_ROUNDS):  # untimed: until traffic's shapes are compiled
                compiled = stats(url)["background_compiles"]
                timed_together(calls, 1, warm=0)
                if n >= 1 and stats(url)["background_compiles"] == compiled:
                    break
            headers.clear()
            counters = lambda: stats(url) | engine_stats()  # noqa: E731
            seconds = timed_together(calls, o.rounds, warm=0, counters=counters)
        finally:
            client.close()
    moved = {k: seconds.moved[k] / o.rounds for k in COUNTED}
    engine_moved = {k: seconds.moved[f"engine {k}"] / o.rounds for k in COUNTED[2:]}
    vectors = np.concatenate(seconds.last["engine"])
    return {
        "seconds": dict(seconds), "samples": {k: list(v) for k, v in seconds.samples.items()},
        "moved": moved, "engine_moved": engine_moved,
        "headers": {h: statistics.mean(s[h] for s in headers) for h in (*HEADERS, "client")},
        "retried": client.retried, "tokens": sum(len(ids) for w in works for ids in w.inputs),
        "words": sum(len(t.split()) for t in texts),
        "diff": float(np.abs(vectors - seconds.last["st"]).max()),
    }  # fmt: skip


COLUMNS = (
    col("path", left=True), col("seconds (median)", ".3f"), col("tokens/s", ".0f"),
    col("vs sentence-transformers", ".2f", "x"), col("vs the engine", ".2f", "x"),
)  # fmt: skip


def rows_of(r: dict[str, Any], o: argparse.Namespace) -> list[tuple]:
    s = r["seconds"]
    n = o.texts // o.per_request
    labels = {
        "served": f"served: `/v1/embeddings`, {n} requests of {o.per_request} texts, "
        f"{o.concurrency} in flight ({r['retried']} 503s retried)",
        "engine": f"engine: the {n} requests' works in one `score_batch`",
        "engine_each": f"engine: one `score_batch` a request, {n} in turn",
        "st": f"sentence-transformers `encode(batch_size={o.per_request})` in process",
    }
    return [
        (label, s[k], r["tokens"] / s[k], s["st"] / s[k], s["engine"] / s[k])
        for k, label in labels.items()
    ]


def where_it_goes(r: dict[str, Any], o: argparse.Namespace) -> list[str]:
    m, e, h = r["moved"], r["engine_moved"], r["headers"]
    n = o.texts // o.per_request
    pad = lambda x: x["computed_tokens"] / max(1.0, x["useful_tokens"])  # noqa: E731
    return [
        f"served, a round: {m['batches']:.1f} engine calls of "
        f"{m['works'] / max(1, m['batches']):.1f} requests, {m['steps']:.1f} steps, "
        f"{m['engine_seconds']:.3f} s in engine steps "
        f"(of the round's {r['seconds']['served']:.3f} s), padding (computed / real) "
        f"{pad(m):.3f}; {m['background_compiles']:.1f} background and "
        f"{m['request_path_compiles']:.1f} request-path compiles",
        f"engine in process, a round (the one call, then the {n} of one request each): "
        f"{e['steps']:.1f} steps, {e['engine_seconds']:.3f} s in them, padding {pad(e):.3f}",
        f"a served request, mean of {n * o.rounds}: {h['client']:.3f} s at the client, "
        f"{h['x-total-time']:.3f} s in the ingress (tokenization {h['x-tokenization-time']:.3f}, "
        f"queue {h['x-queue-time']:.3f}, inference {h['x-inference-time']:.3f}), "
        f"{h['client'] - h['x-total-time']:.3f} s outside it (proxy and HTTP)",
    ]


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    r = measure_paths(o, Path(tempfile.mkdtemp(prefix="bench-encoder-served-")))
    run.say(json.dumps({k: r[k] for k in ("seconds", "moved", "engine_moved", "headers")}))
    shape = SHAPES[o.shape]
    notes = (
        shape.describe(o.shape, o.layers or shape.layers) + ", saved by sentence-transformers; "
        "served with the shipped serve_config.yaml, only `model` changed; torch on every core",
        f"{o.texts} texts of {o.min_words}..{o.max_words} words ({r['words']} words, "
        f"{r['tokens']} tokens with [CLS] and [SEP]); medians of {o.rounds} rounds, each "
        "running every path once in turn, after untimed rounds until one compiled nothing; "
        "the replica's engine threads at niceness 10 (the shipped engine_niceness), the "
        "in-process engine and sentence-transformers at 0; max abs diff engine vs "
        f"sentence-transformers {r['diff']:.1e}",
        "targets (issue 80): served >= 1.0x sentence-transformers, engine >= 1.2x",
        *where_it_goes(r, o),
    )
    figures = {k: r[k] for k in ("samples", "moved", "engine_moved", "headers")}
    return [
        run.result(
            "A served encoder at real lengths", [table(COLUMNS, rows_of(r, o))],
            key=f"encoder-served-{o.shape}", notes=notes, figures=figures,
        )
    ]  # fmt: skip


WORKLOAD = Workload(
    options=(
        Option("--shape", "minilm", "the encoder's shape", tuple(SHAPES)),
        Option("--layers", 0, "layers (0: the shape's own)"),
        Option("--texts", 64), Option("--min-words", 1), Option("--max-words", 60),
        Option("--per-request", 16, "texts a served request (and sentence-transformers' batch)"),
        Option("--concurrency", 4, "served requests in flight"),
        Option("--rounds", 5, "timed rounds, every path once each"),
        Option("--port", 8010, "the served app's (if free)"),
    ),
    measure=measure,
)  # fmt: skip
