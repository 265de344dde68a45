"""Encoders (issue 62; docs/benchmarks.md, "Encoders"): a bge-m3-shaped XLM-RoBERTa (hidden
1024, 16 heads, MLP 4096, vocabulary 250,002; ``--layers`` of bge-m3's 24, random weights,
float32) as an embedder (CLS pooling, Normalize: bge-m3's dense vectors) and as a cross-encoder
(bge-reranker-v2-m3's head: one label, sigmoid), each saved by sentence-transformers. Its
tokenizer is a Unigram over a word list written here, one token per word.

- **embed**: a mixed-length corpus (``--texts`` of log-uniform 8..512 tokens) through the
  engine (one ``score_batch``), ``python -m batch embed``'s stages in process, the shipped app
  over HTTP (``/v1/embeddings``), sentence-transformers' ``encode`` and Infinity;
- **rerank**: a 16-token query and ``--docs`` documents of log-uniform 32..256 tokens through
  the engine (every pair one sequence of one packed call), the shipped app (``/v1/rerank``),
  ``CrossEncoder.predict`` and Infinity's ``rerank``.

Tokens/s count real tokens (specials included, as every path computes them); padding is the
engine's computed / real tokens. Infinity (``infinity-emb``, its torch engine on the CPU)
runs in its own venv (``make bench-infinity`` makes .venv-infinity) through
loadtest/infinity_runner.py; without it its rows say so.

``--shape`` minilm or bert-base: a BERT of that shape (loadtest.encoder_models; mean pooling,
max_seq_length 256, a WordPiece tokenizer over English words) in place of XLM-RoBERTa.

    python -m loadtest run encoder [--shape bge-m3] [--layers 6] [--texts 200] [--docs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from loadtest import peers
from loadtest.bench_common import settings_for
from loadtest.bench_embed import counted, input_bodies, padding, served_passes
from loadtest.encoder_models import (
    SHAPES,
    Shape,
    for_old_sentence_transformers,
    save_cross_encoder,
    save_embedder,
    text_of,
)
from loadtest.harness import Option, Result, Run, Workload, col, table, timed_once


def shape_of(o: argparse.Namespace) -> tuple[Shape, int]:
    """The ``--shape`` and its layers (``--layers``; 0: the shape's own)."""
    shape = SHAPES[o.shape]
    return shape, o.layers or (shape.layers if o.shape != "bge-m3" else 6)


def log_uniform(rng: np.random.Generator, count: int, low: int, high: int) -> np.ndarray:
    return np.exp(rng.uniform(np.log(low), np.log(high), count)).astype(int)


def describe(o: argparse.Namespace) -> str:
    shape, layers = shape_of(o)
    if o.shape == "bge-m3":
        return (
            f"bge-m3's shape cut to {layers} of its 24 layers (XLM-RoBERTa, hidden 1024, 16 "
            "heads, MLP 4096, vocabulary 250,002, random weights, float32)"
        )
    return shape.describe(o.shape, layers)


def result_key(o: argparse.Namespace) -> str:
    return "encoder" if o.shape == "bge-m3" else f"encoder-{o.shape}"


def longest(shape: Shape) -> int:
    """The embed corpus's longest text in words: the shape's limit (bge-m3: one token a
    word; BERT's WordPiece about 1.3 a word, so its texts stay within max_seq_length)."""
    return 512 if shape.family != "bert" else shape.max_seq_length * 3 // 4


def embed_paths(o: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    from loadtest.bench_embed import in_process

    shape, layers = shape_of(o)
    model_dir = save_embedder(work_dir / "embedder", shape, layers)
    rng = np.random.default_rng(0)
    lengths = log_uniform(rng, o.texts, 8, longest(shape))
    texts = [text_of(rng, n, shape) for n in lengths]
    r = in_process(settings_for(model_dir, work_dir), texts, model_dir, keep_engine=True)
    reference, again = np.asarray(r.pop("reference")), r.pop("again")
    job = {"model": str(for_old_sentence_transformers(model_dir)), "kind": "embed",
           "texts": texts, "batch_size": 32}  # fmt: skip
    answer = peers.infinity(job, o.infinity, work_dir)
    if answer is not None:
        r["infinity_s"], r["infinity_version"] = answer["seconds"], answer["version"]
        r["infinity_diff"] = float(np.abs(np.asarray(answer["outputs"]) - reference).max())
    bodies = input_bodies(texts, o.per_request)
    passes = served_passes(model_dir, "/v1/embeddings", bodies, o.concurrency, o.port, again)
    return r | passes


def rerank_in_process(settings: Any, query: str, docs: list[str], model_dir: Path) -> dict:
    """The engine (the pairs as the app encodes them, one packed call) and CrossEncoder."""
    from app.cross_encoder import activated, encode_pairs
    from app.service import ScoringService
    from replicas.engine.scoring_engine import ScoringEngine

    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings)
    work = encode_pairs(service.tokenizer, service.info, [(query, doc) for doc in docs])
    engine.score_batch([type(work)(work.inputs[:8], second_starts=work.second_starts[:8])])
    (logits,), engine_s, moved = counted(engine, lambda: engine.score_batch([work]))
    scores = activated(np.asarray(logits), "sigmoid")[:, 0]
    st_s, reference = timed_once(peers.cross_encoder(model_dir, [(query, doc) for doc in docs]))
    return {
        "tokens": sum(len(ids) for ids in work.inputs), "engine_s": engine_s,
        "engine_moved": moved, "st_s": st_s, "reference": reference,
        "diff": float(np.abs(scores - reference).max()),
    }  # fmt: skip


def rerank_paths(o: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    shape, layers = shape_of(o)
    model_dir = save_cross_encoder(work_dir / "reranker", shape, layers)
    rng = np.random.default_rng(1)
    query = text_of(rng, 14, shape)  # bge-m3: 16 tokens with <s> and </s>
    docs = [text_of(rng, n, shape) for n in log_uniform(rng, o.docs, 32, longest(shape) // 2)]
    r = rerank_in_process(settings_for(model_dir, work_dir), query, docs, model_dir)
    reference = r.pop("reference")
    job = {"model": str(model_dir), "kind": "rerank", "query": query, "docs": docs,
           "batch_size": 32}  # fmt: skip
    answer = peers.infinity(job, o.infinity, work_dir)
    if answer is not None:
        r["infinity_s"], r["infinity_version"] = answer["seconds"], answer["version"]
        r["infinity_diff"] = float(np.abs(np.asarray(answer["outputs"]) - reference).max())
    body = json.dumps({"query": query, "documents": docs}).encode()
    n = o.rerank_requests
    passes = served_passes(model_dir, "/v1/rerank", [body] * n, 1, o.port)
    return r | passes | {"served_s": passes["served_s"] / n, "served2_s": passes["served2_s"] / n}


COLUMNS = (
    col("path", left=True), col("seconds", ".2f"), col("tokens/s", ".0f"),
    col("vs sentence-transformers", ".2f"), col("vs Infinity", ".2f"),
    col("padding (computed / real)", ".3f"), col("max abs diff vs sentence-transformers", ".1e"),
)  # fmt: skip


def served_line(name: str, r: dict[str, Any]) -> str:
    """Where the served passes' time went: the replica's engine seconds, steps, compiles."""
    parts = []
    for key in ("served", "served2"):
        m = r[f"{key}_moved"]
        parts.append(
            f"{m['engine_seconds']:.1f} s in {m['steps']} engine steps, "
            f"{m['background_compiles']} background and {m['request_path_compiles']} "
            "request-path compiles"
        )
    line = f"{name} served, first pass: {parts[0]}; pass {r['served2_pass']}: {parts[1]}"
    if "served_engine_s" not in r:
        return line
    ratios = [
        f"{r[f'{key}_engine_s'] / r[f'{key}_s']:.2f}x (the engine {r[f'{key}_engine_s']:.1f} s)"
        for key in ("served", "served2")
    ]  # fmt: skip
    return f"{line}; served vs an engine pass timed just before it: {ratios[0]}, {ratios[1]}"


def rows_of(r: dict[str, Any], paths: list[tuple[str, str]]) -> list[tuple]:
    rate = {key: r["tokens"] / r[f"{key}_s"] for key, _ in paths if f"{key}_s" in r}
    rows = []
    for key, label in paths:
        if key not in rate:
            rows.append((f"{label}: not run (make bench-infinity)", *[None] * 6))
            continue
        moved = r.get(f"{key}_moved")
        pad = padding(moved) if moved and "computed_tokens" in moved else None
        diff = r["diff"] if key == "engine" else r.get(f"{key}_diff")
        vs_infinity = rate[key] / rate["infinity"] if "infinity" in rate else None
        rows.append((label, r[f"{key}_s"], rate[key], rate[key] / rate["st"], vs_infinity,
                     pad, diff))  # fmt: skip
    return rows


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    work_dir = Path(tempfile.mkdtemp(prefix="bench-encoder-"))
    e = embed_paths(o, work_dir)
    run.say(f"embed: { ({k: v for k, v in e.items() if not k.endswith('_moved')}) }")
    r = rerank_paths(o, work_dir)
    run.say(f"rerank: { ({k: v for k, v in r.items() if not k.endswith('_moved')}) }")
    version = e.get("infinity_version", "not installed")
    embed_rows = rows_of(e, [
        ("engine", "engine"), ("batch", "batch (`python -m batch embed`'s stages in process)"),
        ("served", f"served: `/v1/embeddings`, {o.per_request} texts a request, concurrency "
                   f"{o.concurrency}, first pass ({e['served_retried']} 503s retried)"),
        ("served2", f"served: pass {e['served2_pass']}, the first after it to compile nothing "
                    f"in the background ({e['served2_retried']} 503s retried)"),
        ("st", "sentence-transformers `encode` (batches of 32)"),
        ("infinity", f"Infinity {version} (torch, CPU, batches of 32)"),
    ])  # fmt: skip
    rerank_rows = rows_of(r, [
        ("engine", "engine"),
        ("served", f"served: `/v1/rerank`, one request of {o.docs} documents, mean of "
                   f"{o.rerank_requests}, first pass"),
        ("served2", f"served: pass {r['served2_pass']}, the first after it to compile nothing "
                    "in the background"),
        ("st", "sentence-transformers `CrossEncoder.predict` (batches of 32)"),
        ("infinity", f"Infinity {version} `rerank` (torch, CPU, batches of 32)"),
    ])  # fmt: skip
    shape, _ = shape_of(o)
    unit = "tokens" if shape.family != "bert" else "words"
    notes = (
        f"{describe(o)}, saved by sentence-transformers; served with the shipped "
        "serve_config.yaml, only `model` changed; torch on every core for "
        "sentence-transformers and Infinity",
        f"embed: {o.texts} texts of log-uniform 8..{longest(shape)} {unit} "
        f"({e['tokens']} real tokens), {shape.pooling} pooling and Normalize; engine: one "
        "`score_batch`",
        f"rerank: a 14-word query and {o.docs} documents of log-uniform "
        f"32..{longest(shape) // 2} {unit} "
        f"({r['tokens']} real tokens in the pairs), one label through sigmoid; engine: every "
        "pair one sequence of one packed call",
        "targets (issue 62): engine >= 1.2x sentence-transformers and >= 1x Infinity, "
        "served >= 0.9x the engine, padding <= 1.05",
        *(served_line(name, x) for name, x in (("embed", e), ("rerank", r))),
    )
    tables = [
        table(COLUMNS, embed_rows, missing="", title=f"Embed ({shape.pooling} pooling, Normalize)"),
        table(COLUMNS, rerank_rows, missing="", title="Rerank (a cross-encoder, one label)"),
    ]
    figures = {"embed": {k: v for k, v in e.items() if k.endswith("_moved")},
               "rerank": {k: v for k, v in r.items() if k.endswith("_moved")}}  # fmt: skip
    return [run.result("Encoders", tables, key=result_key(o), notes=notes, figures=figures)]


WORKLOAD = Workload(
    options=(
        Option("--shape", "bge-m3", "the encoders' shape (loadtest.encoder_models)",
               tuple(SHAPES)),
        Option("--layers", 0, "layers (0: bge-m3 6 of its 24, the others their own)"),
        Option("--texts", 200, "embed: texts of log-uniform 8..512 tokens (BERT: 8..192 words)"),
        Option("--docs", 100, "rerank: documents of log-uniform 32..256 tokens (BERT: words)"),
        Option("--rerank-requests", 3, "rerank: timed served requests"),
        Option("--per-request", 8, "embed: texts a served request"),
        # 4 x 8 texts (~1.3 s of engine work each here) keep the replica busy within the
        # shipped admission's 5 s bound (max_queue_wait_s); 8 overran it (43-87 503s).
        Option("--concurrency", 4, "embed: served requests in flight"),
        Option("--port", 8000, "the served app's (if free)"),
        Option("--infinity", str(peers.INFINITY), "Infinity's interpreter ('' to skip)"),
    ),
    measure=measure,
)  # fmt: skip
