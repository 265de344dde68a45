"""Served retrieval models against sentence-transformers in process (docs/benchmarks.md,
"Served retrieval models"): a ColBERT (``MultiVectorEncoder``) and a SPLADE (``SparseEncoder``)
of BERT-base's width at ``--layers`` layers (loadtest.retrieval_models, random weights; ``--shape
tiny``: tests.support.retrieval_helpers' tiny ones, a quick check), each served by the shipped
app (serve_config.yaml, only ``model`` changed; one private Ray cluster as
loadtest.bench_batch_serve.served_app starts it, the app redeployed per model) beside the
library in this process on the same CPU, torch at its default threads:

- late interaction: one ``/v1/rerank`` of ``--documents`` documents of ``--min-words`` ..
  ``--max-words`` words (~180 tokens) behind one query, against ``encode_query`` +
  ``encode_document`` + ``similarity`` (MaxSim) on the same texts;
- sparse: one ``/embed_sparse`` of the same documents against ``encode_document``.

Medians of ``--rounds`` rounds that run both paths once each, in an order of the round's own,
after untimed served requests until one compiles and declines nothing (``WARM_ROUNDS`` at
most) and one untimed library call of 8 documents. Ratio: library seconds / served seconds.
Padding: the replica's computed / real tokens (``/v1/stats``) over the timed rounds. Max
diff: the served scores (rerank relevance; sparse weights, dense) against the library's.
Where the served time goes: each response's timing headers (tokenization, queue: admission,
Serve's queues and the transfer of the replica's answer; inference: engine steps), the
ingress's rest (MaxSim or the sparse pairs and the JSON body), the client's rest (proxy and
HTTP), and MaxSim timed alone. Each model's row is stored as it ends (a run stopped early
keeps the finished ones).

    python -m loadtest run retrieval_served [--shape tiny] [--layers 6,12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadtest import peers
from loadtest.bench_batch_serve import serving
from loadtest.bench_encoder_served import COUNTED, TimedClient
from loadtest.encoder_models import ENGLISH, SHAPES
from loadtest.harness import (
    Option,
    Result,
    Run,
    Workload,
    col,
    counts,
    ratio,
    table,
    timed,
    timed_together,
)

READY_S = 1800.0
WARM_ROUNDS = 3  # untimed served requests at most: until one compiles and declines nothing
WARM_COUNTED = ("background_compiles", "request_path_compiles", "declined_one_off")
TINY_WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "seven", "blue",
              "red", "what", "is", "the", "a", "of", "and", "to", "in", "stones")  # fmt: skip
QUERY = "what is the river of stone and cloud in the north"


def documents(o: argparse.Namespace) -> list[str]:
    """``--documents`` texts of ``--min-words``..``--max-words`` words (tiny: of its vocabulary,
    a third as many words: its documents are cut at 100 tokens)."""
    rng = np.random.default_rng(0)
    tiny = o.shape == "tiny"
    low, high = (o.min_words // 3, o.max_words // 3) if tiny else (o.min_words, o.max_words)
    words = TINY_WORDS if tiny else ENGLISH
    lengths = rng.integers(low, high + 1, o.documents)
    return [" ".join(rng.choice(words, int(n))).capitalize() + "." for n in lengths]


def save_model(kind: str, o: argparse.Namespace, layers: int, work_dir: Path) -> Path:
    from loadtest.retrieval_models import save_colbert_model, save_splade_model, save_tiny

    directory = work_dir / f"{o.shape}-{kind}-{layers}"
    if (directory / "modules.json").exists():  # built by an earlier run into --models
        return directory
    if o.shape == "tiny":
        return save_tiny(directory, kind)
    shape = SHAPES[o.shape]
    save = save_colbert_model if kind == "late" else save_splade_model
    return save(directory, shape, layers)


def relevance(answer: dict[str, Any], n: int) -> np.ndarray:
    """A /v1/rerank answer's relevance by document index."""
    scores = np.zeros(n, np.float64)
    for result in answer["results"]:
        scores[result["index"]] = result["relevance_score"]
    return scores


def sparse_dense(rows: list[list[dict[str, float]]], width: int) -> np.ndarray:
    """An /embed_sparse answer as dense ``[texts, width]`` weights."""
    dense = np.zeros((len(rows), width), np.float64)
    for i, row in enumerate(rows):
        for pair in row:
            dense[i, int(pair["index"])] = pair["value"]
    return dense


def maxsim_alone(query: Any, docs: list[Any], repeats: int = 5) -> float:
    """Seconds of the ingress's MaxSim (app.retrieval_inputs.maxsim) on the library's vectors."""
    from threadpoolctl import threadpool_limits

    from app.retrieval_inputs import maxsim
    from replicas.embed_contract import LateInteraction

    q, d = np.asarray(query), [np.asarray(v) for v in docs]
    late = LateInteraction(query_length=len(q))
    with threadpool_limits(1):  # as the ingress runs it: Ray's workers get OMP_NUM_THREADS=1
        return timed(lambda: maxsim(q, d, late), repeats, warm=0)


def measure_one(
    kind: str, layers: int, o: argparse.Namespace, run: Run, work_dir: Path,
    deploy: Callable[[str], str],
) -> dict[str, Any]:  # fmt: skip
    from loadtest.bench_batch_serve import stats

    texts = documents(o)
    model_dir = save_model(kind, o, layers, work_dir)
    run.say(f"{kind}, {layers} layers: saved {model_dir}")
    library, library_call = peers.retrieval_library(kind, model_dir, QUERY, texts, o.batch_size)
    tokens = sum(len(ids) for ids in library.tokenizer(texts)["input_ids"])
    if kind == "late":
        route, body = "/v1/rerank", {"query": QUERY, "documents": texts}
    else:
        route, body = "/embed_sparse", {"inputs": texts, "input_type": "document"}
    url = deploy(str(model_dir))
    client, encoded, samples = TimedClient(url, route, 1), json.dumps(body).encode(), []
    try:
        run.say(f"{kind}, {layers} layers: serving at {url}")
        for _ in range(WARM_ROUNDS):  # untimed: until one compiles and declines nothing
            ahead = stats(url)
            client.post(encoded)
            behind = stats(url)
            if all(ahead.get(k, 0) == behind.get(k, 0) for k in WARM_COUNTED):
                break
        calls = {"served": lambda: samples.append(client.post(encoded)), "library": library_call}
        timings = timed_together(calls, o.rounds, warm=0, shuffle=True, counters=lambda: stats(url))
        last = {"served": client.last.json(), "library": timings.last["library"]}
    finally:
        client.close()
    moved = {k: timings.moved[k] / o.rounds for k in COUNTED}
    seconds = dict(timings)
    reference = last["library"]
    if kind == "late":
        scores, query, docs = reference
        got = relevance(last["served"], len(texts))
        diff = float(np.abs(got - np.asarray(scores, np.float64)).max())
        alone = maxsim_alone(query[0], docs)
        vectors = tokens + len(query[0])  # the replica answers every input token's vector
        answer_mb = vectors * int(query[0].shape[-1]) * 4 / 1e6
        active = None
    else:
        dense = reference.to_dense().cpu().numpy().astype(np.float64)
        got = sparse_dense(last["served"], dense.shape[1])
        diff = float(np.abs(got - dense).max())
        alone, answer_mb = None, None
        active = float((dense > 0).sum(axis=1).mean())
    headers = {h: statistics.mean(s[h] for s in samples) for h in samples[0]}
    run.say(f"{kind}, {layers} layers: {json.dumps({'seconds': seconds, 'moved': moved})}")
    return {
        "kind": kind, "layers": layers, "seconds": seconds, "moved": moved, "headers": headers,
        "diff": diff, "tokens": tokens, "maxsim_s": alone, "answer_mb": answer_mb,
        "active": active,
    }  # fmt: skip


COLUMNS = (
    col("model", left=True), col("layers", "d"), col("served s", ".3f"), col("library s", ".3f"),
    col("ratio (library / served)", ".2f", "x"), col("padding (computed / real)", ".3f"),
    col("max abs diff", ".1e"), col("machine", left=True), col("tree", left=True),
    col("date", left=True), col("load before / after", left=True),
)  # fmt: skip
LABELS = {
    "late": "ColBERT (`MultiVectorEncoder`): `/v1/rerank` vs `encode_query` + "
    "`encode_document` + `similarity`",
    "sparse": "SPLADE (`SparseEncoder`): `/embed_sparse` vs `encode_document`",
}


def padding(moved: dict[str, float]) -> float | None:
    return ratio(moved["computed_tokens"], moved["useful_tokens"])


def where_it_goes(r: dict[str, Any]) -> str:
    h, m = r["headers"], r["moved"]
    rest = h["x-total-time"] - h["x-tokenization-time"] - h["x-queue-time"] - h["x-inference-time"]
    line = (
        f"{r['kind']}, {r['layers']} layers, where a served request's {h['client']:.3f} s go "
        f"(mean of the timed rounds): ingress {h['x-total-time']:.3f} s (tokenization "
        f"{h['x-tokenization-time']:.3f}, queue and transfer {h['x-queue-time']:.3f}, engine "
        f"{h['x-inference-time']:.3f}, the ingress's answer after it {rest:.3f}), "
        f"{h['client'] - h['x-total-time']:.3f} s outside it (proxy and HTTP); the replica: "
        f"{m['batches']:.1f} engine calls, {m['steps']:.1f} steps, {m['engine_seconds']:.3f} s "
        f"in them, {m['background_compiles']:.1f} background and "
        f"{m['request_path_compiles']:.1f} request-path compiles; {r['tokens']} document tokens"
    )
    if r["maxsim_s"] is not None:
        line += (
            f"; token vectors answered {r['answer_mb']:.1f} MB (float32), MaxSim of them alone "
            f"(app.retrieval_inputs.maxsim, one BLAS thread) {r['maxsim_s'] * 1e3:.1f} ms"
        )
    if r["active"] is not None:
        line += f"; {r['active']:.0f} active terms a document"
    return line


def result_of(o: argparse.Namespace, run: Run, results: list[dict[str, Any]]) -> Result:
    import torch

    load = f"{run.load_before[0]:.2f} / {os.getloadavg()[0]:.2f}"
    machine = f"{run.result('', []).machine}; torch {torch.get_num_threads()} threads"
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [
        (LABELS[r["kind"]], r["layers"], r["seconds"]["served"], r["seconds"]["library"],
         ratio(r["seconds"]["library"], r["seconds"]["served"]), padding(r["moved"]), r["diff"],
         machine, run.tree, date, load)
        for r in results
    ]  # fmt: skip
    models = (
        "tests.support.retrieval_helpers' tiny ColBERT and SPLADE (hidden 32, 2 layers)"
        if o.shape == "tiny"
        else f"{o.shape}'s width (hidden 768, 12 heads, MLP 3072, vocabulary 30,522 rows; "
        "random weights, float32): ColBERT with a token Dense to 128 (no bias), "
        "MultiVectorMask (punctuation skiplist), Normalize; query expansion fixed to 32, not "
        "attended; document_length 256; SPLADE: BertForMaskedLM + SpladePooling(max), its "
        "decoder bias set so ~256 terms of a document stay active (loadtest.retrieval_models)"
    )
    notes = (
        models,
        f"{o.documents} documents of {o.min_words}..{o.max_words} words behind one query; "
        "served with the shipped serve_config.yaml, only `model` changed (the replica's engine "
        "threads at niceness 10, the shipped engine_niceness); the library in this process at "
        f"torch's default threads ({torch.get_num_threads()}), `batch_size={o.batch_size}`; "
        f"medians of {o.rounds} rounds, each running both once in its own order, after "
        "untimed served requests until one compiled and declined nothing and one untimed "
        "library call of 8 documents",
        "targets: ratio >= 1.2x, padding <= 1.05",
        *(where_it_goes(r) for r in results),
    )
    key = "retrieval_served" + ("-tiny" if o.shape == "tiny" else "")
    title = "Served retrieval models (ColBERT, SPLADE) against sentence-transformers"
    tables = [table(COLUMNS, rows)]
    return run.result(title, tables, key=key, notes=notes, figures={"runs": results})


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    work_dir = Path(o.models or tempfile.mkdtemp(prefix="bench-retrieval-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    layer_counts = [2] if o.shape == "tiny" else counts(o.layers)
    kinds = [k for k in o.kinds.split(",") if k]
    results: list[dict[str, Any]] = []
    with serving(o.port, READY_S) as deploy:
        for layers in layer_counts:
            for kind in kinds:
                results.append(measure_one(kind, layers, o, run, work_dir, deploy))
                # each model's row stored as it ends: a run stopped early keeps the finished
                run.say(f"stored {result_of(o, run, results).save(o.out)}")
    return [result_of(o, run, results)]


WORKLOAD = Workload(
    options=(
        Option("--shape", "bert-base", "the backbone's shape", ("bert-base", "tiny")),
        Option("--layers", "6,12", "layer counts, each a model of each kind (tiny: its 2)"),
        Option("--kinds", "late,sparse", "late (ColBERT) and/or sparse (SPLADE)"),
        Option("--documents", 100), Option("--min-words", 125), Option("--max-words", 140),
        Option("--batch-size", 32, "the library's encode batch_size (its default)"),
        Option("--rounds", 3, "timed rounds, both paths once each"),
        Option("--port", 8475, "the served app's (if free)"),
        Option("--models", "", "a folder the models are built into once and reused from "
               "(default: a new temporary one)"),
    ),
    measure=measure,
)  # fmt: skip
