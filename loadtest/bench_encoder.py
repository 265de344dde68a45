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

    python -m loadtest run encoder [--layers 6] [--texts 200] [--docs 100]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench_embed import COUNTERS, counted, padding
from loadtest.harness import Option, Result, Run, Workload, col, table

WORDS = tuple(f"w{i}" for i in range(1000))  # one Unigram piece each
INFINITY = Path(".venv-infinity/bin/python")
RUNNER = Path(__file__).with_name("infinity_runner.py")


def bge_m3_config(layers: int, **changes: Any) -> Any:
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=250_002, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
        intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, **changes,
    )  # fmt: skip


def save_tokenizer(directory: Path) -> None:
    """An XLMRobertaTokenizerFast (Unigram) over ``WORDS``, at most 512 tokens a sequence."""
    from transformers import XLMRobertaTokenizerFast

    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + word, -1.0) for word in WORDS] + [("<mask>", 0.0)]
    XLMRobertaTokenizerFast(vocab=pieces, model_max_length=512).save_pretrained(directory)


def save_embedder(directory: Path, layers: int) -> Path:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(0)
    hf_dir = directory.parent / f"{directory.name}-hf"
    model = transformers.XLMRobertaModel(bge_m3_config(layers), add_pooling_layer=False)
    model.save_pretrained(hf_dir, safe_serialization=True)
    save_tokenizer(hf_dir)
    modules = [Transformer(str(hf_dir), max_seq_length=512), Pooling(1024, "cls"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(directory), safe_serialization=True)
    return directory


def save_cross_encoder(directory: Path, layers: int) -> Path:
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    torch.manual_seed(1)
    hf_dir = directory.parent / f"{directory.name}-hf"
    config = bge_m3_config(layers, num_labels=1)
    transformers.XLMRobertaForSequenceClassification(config).save_pretrained(hf_dir)
    save_tokenizer(hf_dir)
    CrossEncoder(str(hf_dir), device="cpu", max_length=512).save(str(directory))
    return directory


def for_old_sentence_transformers(directory: Path) -> Path:
    """A copy of ``directory`` (Transformer, Pooling, Normalize) as sentence-transformers 3
    (Infinity's pin) reads one: its modules.json naming the modules by their old paths, the
    Transformer's and Pooling's configs in version 3's keys; the other files linked."""
    old = directory.parent / f"{directory.name}-st3"
    shutil.copytree(directory, old, copy_function=os.link)
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        module["type"] = f"sentence_transformers.models.{module['type'].rsplit('.', 1)[-1]}"
    (old / "modules.json").unlink()
    (old / "modules.json").write_text(json.dumps(modules, indent=2))
    config = json.loads((directory / "sentence_bert_config.json").read_text())
    kept = {k: config[k] for k in ("max_seq_length", "do_lower_case") if k in config}
    (old / "sentence_bert_config.json").unlink()
    (old / "sentence_bert_config.json").write_text(json.dumps(kept))
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = pooling.pop("embedding_dimension")
    (old / "1_Pooling" / "config.json").unlink()
    (old / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return old


def words(rng: np.random.Generator, count: int) -> str:
    return " ".join(rng.choice(WORDS, count))


def log_uniform(rng: np.random.Generator, count: int, low: int, high: int) -> np.ndarray:
    return np.exp(rng.uniform(np.log(low), np.log(high), count)).astype(int)


def infinity(job: dict[str, Any], python: str, work_dir: Path) -> dict[str, Any] | None:
    """Infinity's answer to ``job`` (loadtest/infinity_runner.py), None without its venv."""
    if not python or not Path(python).exists():
        return None
    job_path, out_path = work_dir / "infinity-job.json", work_dir / "infinity-out.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    subprocess.run([python, str(RUNNER), str(job_path), str(out_path)], check=True, env=env)
    return json.loads(out_path.read_text())


def settings_for(model_dir: Path, work_dir: Path) -> Any:
    """The shipped serve_config.yaml's settings with only ``model`` changed."""
    import yaml

    from replicas.settings import ReplicaSettings

    (app,) = yaml.safe_load(Path("serve_config.yaml").read_text())["applications"]
    cache = str(work_dir / "cache")
    return ReplicaSettings.from_mapping(
        {**app["args"], "model": str(model_dir), "compilation_cache_dir": cache}
    )


def embed_paths(o: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    from loadtest.bench_embed import in_process

    model_dir = save_embedder(work_dir / "embedder", o.layers)
    rng = np.random.default_rng(0)
    texts = [words(rng, n) for n in log_uniform(rng, o.texts, 8, 512)]
    r = in_process(settings_for(model_dir, work_dir), texts, model_dir, keep_engine=True)
    reference, again = np.asarray(r.pop("reference")), r.pop("again")
    job = {"model": str(for_old_sentence_transformers(model_dir)), "kind": "embed",
           "texts": texts, "batch_size": 32}  # fmt: skip
    answer = infinity(job, o.infinity, work_dir)
    if answer is not None:
        r["infinity_s"], r["infinity_version"] = answer["seconds"], answer["version"]
        r["infinity_diff"] = float(np.abs(np.asarray(answer["outputs"]) - reference).max())
    step = o.per_request
    bodies = [json.dumps({"input": texts[i : i + step]}).encode() for i in range(0, o.texts, step)]
    passes = served_passes(model_dir, "/v1/embeddings", bodies, o.concurrency, o.port, again)
    return r | passes


STEADY_PASSES = 3  # timed passes after the first, at most, to reach one that compiles nothing


def served_passes(
    model_dir: Path, route: str, bodies: list[bytes], concurrency: int, port: int,
    beside: Callable[[], tuple[float, dict]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The shipped app serving ``model_dir``: ``bodies`` posted to ``route`` in timed passes
    (``concurrency`` in flight, 503s retried after Retry-After), each with how far it moved
    the replica's counters: the first after one untimed round of ``concurrency`` bodies
    (``served``), then more until one compiles nothing in the background (traffic's shapes
    compile once they recur), at most ``STEADY_PASSES`` (``served2``; ``served2_pass``: which
    pass it was). ``beside``: an in-process engine pass of the same work, timed just before
    each served pass (``served_engine_s``, ``served2_engine_s``), so the ratio does not span
    the minutes in which the machine's speed moves."""
    from loadtest.bench_batch_serve import served_app, stats
    from loadtest.client import RetryingClient

    out: dict[str, Any] = {}
    with served_app(port, model=str(model_dir)) as url:
        client = RetryingClient(url, concurrency, 600.0, route=route)
        try:
            client.run(bodies[:concurrency])  # untimed: the first steps
            for n in range(1 + STEADY_PASSES):
                name = "served" if n == 0 else "served2"
                if beside is not None:
                    out[f"{name}_engine_s"] = beside()[0]
                before = stats(url)
                out[f"{name}_s"], out[f"{name}_retried"] = client.run(bodies)
                after = stats(url)
                moved = {k: after[k] - before[k] for k in (*COUNTERS, "steps")}
                out[f"{name}_moved"], out[f"{name}_pass"] = moved, n + 1
                if n > 0 and not moved["background_compiles"]:
                    break
        finally:
            client.close()
    return out


def rerank_in_process(settings: Any, query: str, docs: list[str], model_dir: Path) -> dict:
    """The engine (the pairs as the app encodes them, one packed call) and CrossEncoder."""
    from sentence_transformers import CrossEncoder

    from app.cross_encoder import activated, encode_pairs
    from app.service import ScoringService
    from replicas.engine.scoring_engine import ScoringEngine

    service = ScoringService.from_settings(settings)
    engine = ScoringEngine.from_settings(settings)
    work = encode_pairs(service.tokenizer, service.info, [(query, doc) for doc in docs])
    engine.score_batch([type(work)(work.inputs[:8], second_starts=work.second_starts[:8])])
    (logits,), engine_s, moved = counted(engine, lambda: engine.score_batch([work]))
    scores = activated(np.asarray(logits), "sigmoid")[:, 0]
    model = CrossEncoder(str(model_dir), device="cpu", local_files_only=True)
    model.predict([(query, doc) for doc in docs[:8]])
    start = time.perf_counter()
    reference = np.asarray(model.predict([(query, doc) for doc in docs], batch_size=32))
    st_s = time.perf_counter() - start
    return {
        "tokens": sum(len(ids) for ids in work.inputs), "engine_s": engine_s,
        "engine_moved": moved, "st_s": st_s, "reference": reference,
        "diff": float(np.abs(scores - reference).max()),
    }  # fmt: skip


def rerank_paths(o: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    model_dir = save_cross_encoder(work_dir / "reranker", o.layers)
    rng = np.random.default_rng(1)
    query = words(rng, 14)  # 16 tokens with <s> and </s>
    docs = [words(rng, n) for n in log_uniform(rng, o.docs, 32, 256)]
    r = rerank_in_process(settings_for(model_dir, work_dir), query, docs, model_dir)
    reference = r.pop("reference")
    job = {"model": str(model_dir), "kind": "rerank", "query": query, "docs": docs,
           "batch_size": 32}  # fmt: skip
    answer = infinity(job, o.infinity, work_dir)
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
    notes = (
        f"bge-m3's shape cut to {o.layers} of its 24 layers (XLM-RoBERTa, hidden 1024, 16 "
        "heads, MLP 4096, vocabulary 250,002, random weights, float32), saved by "
        "sentence-transformers; served with the shipped serve_config.yaml, only `model` "
        "changed; torch on every core for sentence-transformers and Infinity",
        f"embed: {o.texts} texts of log-uniform 8..512 tokens "
        f"({e['tokens']} real tokens), CLS pooling and Normalize; engine: one `score_batch`",
        f"rerank: a 16-token query and {o.docs} documents of log-uniform 32..256 tokens "
        f"({r['tokens']} real tokens in the pairs), one label through sigmoid; engine: every "
        "pair one sequence of one packed call",
        "targets (issue 62): engine >= 1.2x sentence-transformers and >= 1x Infinity, "
        "served >= 0.9x the engine, padding <= 1.05",
        *(served_line(name, x) for name, x in (("embed", e), ("rerank", r))),
    )
    tables = [
        table(COLUMNS, embed_rows, missing="", title="Embed (`XLMRobertaModel`, CLS, Normalize)"),
        table(COLUMNS, rerank_rows, missing="", title="Rerank (a cross-encoder, one label)"),
    ]
    figures = {"embed": {k: v for k, v in e.items() if k.endswith("_moved")},
               "rerank": {k: v for k, v in r.items() if k.endswith("_moved")}}  # fmt: skip
    return [run.result("Encoders", tables, key="encoder", notes=notes, figures=figures)]


WORKLOAD = Workload(
    options=(
        Option("--layers", 6, "XLM-RoBERTa layers (bge-m3: 24)"),
        Option("--texts", 200, "embed: texts of log-uniform 8..512 tokens"),
        Option("--docs", 100, "rerank: documents of log-uniform 32..256 tokens"),
        Option("--rerank-requests", 3, "rerank: timed served requests"),
        Option("--per-request", 8, "embed: texts a served request"),
        # 4 x 8 texts (~1.3 s of engine work each here) keep the replica busy within the
        # shipped admission's 5 s bound (max_queue_wait_s); 8 overran it (43-87 503s).
        Option("--concurrency", 4, "embed: served requests in flight"),
        Option("--port", 8000, "the served app's (if free)"),
        Option("--infinity", str(INFINITY), "Infinity's interpreter ('' to skip)"),
    ),
    measure=measure,
)  # fmt: skip
