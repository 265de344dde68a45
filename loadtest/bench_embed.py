"""Embedding throughput (semantics 20; docs/benchmarks.md, "Embeddings"): a mixed-length
corpus (lengths log-uniform between ``--min-tokens`` and ``--max-tokens``) embedded by the
engine (every text packed end to end in rows, one ``score_batch``), by the batch job's stages
in process (``python -m batch embed``'s prepare -> engine stages, tokenization included) and
by sentence-transformers' ``encode`` (its default length-sorted batches of 32) on the same
random weights: a Qwen3-0.6B-shaped embedding model (hidden 1024, 16/8 heads of 128, MLP
3072; SmolLM2's tokenizer, so vocabulary 49152) saved as a sentence-transformers directory
(last token, Normalize). Tokens/s count real tokens only; padding is the engine's computed /
real tokens. The served figure is the shipped app (serve_config.yaml, only ``model``
changed) on a private Ray cluster, ``/v1/embeddings`` requests of ``--per-request`` texts
sent ``--concurrency`` at a time after one untimed round.

    python -m loadtest run embed [--texts 2000] [--layers 28]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadtest import peers
from loadtest.harness import (
    Option,
    Result,
    Run,
    Workload,
    col,
    grown,
    table,
    timed_once,
    timed_together,
)

WORDS = ("alpha", "river", "stone", "cloud", "seven", "blue", "green", "house", "light", "water")


def save_model(directory: Path, layers: int, tokenizer_dir: Path) -> Path:
    """A random Qwen3-0.6B-shaped ``Qwen3Model`` as a sentence-transformers directory."""
    import torch
    import transformers

    from loadtest.encoder_models import save_sentence_transformer

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=49152, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    hf_dir = directory.parent / f"{directory.name}-hf"
    transformers.Qwen3Model(config).save_pretrained(hf_dir, safe_serialization=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.chat_template = None  # plain text, as an embedder's tokenizer
    tokenizer.save_pretrained(hf_dir)
    return save_sentence_transformer(directory, hf_dir, 1024, "lasttoken", 1024)


def corpus(count: int, low: int, high: int, seed: int = 0) -> list[str]:
    """``count`` texts of about log-uniform ``low``..``high`` words (one token each)."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(low), np.log(high), count)).astype(int)
    return [" ".join(rng.choice(WORDS, n)) for n in lengths]


COUNTERS = (
    "engine_seconds", "computed_tokens", "useful_tokens", "request_path_compiles",
    "background_compiles",
)  # fmt: skip


def input_bodies(texts: list[str], step: int) -> list[bytes]:
    """/v1/embeddings bodies of ``step`` texts each."""
    return [json.dumps({"input": texts[i : i + step]}).encode() for i in range(0, len(texts), step)]


STEADY_PASSES = 3  # timed passes after the first, at most, to reach one that compiles nothing


def served_passes(
    model_dir: Path, route: str, bodies: list[bytes], concurrency: int, port: int,
    beside: Callable[[], tuple[float, dict]] | None = None, steady: int = STEADY_PASSES,
) -> dict[str, Any]:  # fmt: skip
    """The shipped app serving ``model_dir``: ``bodies`` posted to ``route`` in timed passes
    (``concurrency`` in flight, 503s retried after Retry-After), each with how far it moved
    the replica's counters: the first after one untimed round of ``concurrency`` bodies
    (``served``), then more until one compiles nothing in the background (traffic's shapes
    compile once they recur), at most ``steady`` (``served2``; ``served2_pass``: which
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
            for n in range(1 + steady):
                name = "served" if n == 0 else "served2"
                if beside is not None:
                    out[f"{name}_engine_s"] = beside()[0]
                before = stats(url)
                out[f"{name}_s"], out[f"{name}_retried"] = client.run(bodies)
                after = stats(url)
                moved = {k: grown(before, after)[k] for k in (*COUNTERS, "steps")}
                out[f"{name}_moved"], out[f"{name}_pass"] = moved, n + 1
                if n > 0 and not moved["background_compiles"]:
                    break
        finally:
            client.close()
    return out


def counted(engine: Any, call: Callable[[], Any]) -> tuple[Any, float, dict[str, float]]:
    """``call()``'s result, its wall seconds and how far it moved the engine's counters."""
    timings = timed_together({"call": call}, 1, warm=0, counters=lambda: engine.stats().as_dict())
    return timings.last["call"], timings["call"], {k: timings.moved[k] for k in COUNTERS}


def padding(moved: dict[str, float]) -> float:
    return moved["computed_tokens"] / max(1, moved["useful_tokens"])


def in_process(
    settings: Any, texts: list[str], model_dir: Path, keep_engine: bool = False
) -> dict[str, Any]:
    """The engine, the batch job's stages and sentence-transformers, one after another;
    ``keep_engine``: also ``again``, which times one more engine pass (seconds, counters)."""
    import pyarrow as pa

    from app.service import ScoringService
    from batch.embed_stage import EmbedColumns, EmbedEngine, EmbedPrepare, finish_embed
    from replicas.contract import EmbedWork
    from replicas.engine.scoring_engine import ScoringEngine

    service = ScoringService.from_settings(settings)
    warm_s, engine = timed_once(lambda: ScoringEngine.from_settings(settings))
    work = service.embedder.text_work(texts, None)
    step = engine.info.limits.max_items_per_request
    works = [EmbedWork(work.inputs[i : i + step]) for i in range(0, len(work.inputs), step)]
    engine.score_batch([EmbedWork(work.inputs[:8])])  # the first call's one-off costs
    results, engine_s, engine_moved = counted(engine, lambda: engine.score_batch(works))
    rows = pa.Table.from_pylist([{"id": i, "text": t} for i, t in enumerate(texts)])

    def batch_job() -> None:
        prepared = EmbedPrepare.around(service, EmbedColumns())(rows)
        finish_embed(EmbedEngine.around(engine)(prepared), None)

    _, batch_s, batch_moved = counted(engine, batch_job)
    st_s, reference = timed_once(peers.st_encode(model_dir, texts))
    kept = {"again": lambda: counted(engine, lambda: engine.score_batch(works))[1:]}
    return (kept if keep_engine else {}) | {
        "tokens": sum(len(ids) for ids in work.inputs), "warm_s": warm_s,
        "engine_s": engine_s, "batch_s": batch_s, "st_s": st_s,
        "engine_moved": engine_moved, "batch_moved": batch_moved,
        "diff": float(np.abs(np.concatenate(results) - reference).max()),
        "reference": reference,
    }  # fmt: skip


def embed_all(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from loadtest.bench_common import settings_for
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    torch.set_num_threads(os.cpu_count() or 1)
    work_dir = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    tokenizer_dir = work_dir / "tokenizer"
    load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct")).save_pretrained(tokenizer_dir)
    model_dir = save_model(work_dir / "model", args.layers, tokenizer_dir)
    settings = settings_for(model_dir, work_dir)
    texts = corpus(args.texts, args.min_tokens, args.max_tokens)
    r = in_process(settings, texts, model_dir)  # its engine is gone before the app starts
    del r["reference"]
    print({k: v for k, v in r.items() if not k.endswith("_moved")}, flush=True)
    bodies = input_bodies(texts, args.per_request)
    r |= served_passes(model_dir, "/v1/embeddings", bodies, args.concurrency, args.port, steady=0)
    r |= {"texts": len(texts), "layers": args.layers}
    for path in ("engine", "batch", "st", "served"):
        r[path] = r["tokens"] / r[f"{path}_s"]
    return r


COLUMNS = (
    col("path", left=True), col("seconds", ".1f"), col("tokens/s", ".0f"),
    col("vs sentence-transformers", left=False), col("padding (computed / real)", ".3f"),
    col("max abs diff vs sentence-transformers", ".1e"),
)  # fmt: skip


def rows_of(r: dict[str, Any], o: argparse.Namespace) -> list[tuple]:
    vs = lambda k: f"{r[k] / r['st']:.2f}x ({r[k] / r['engine']:.2f}x the engine)"  # noqa: E731
    served = (f"served: `/v1/embeddings`, {o.per_request} texts a request, concurrency "
              f"{o.concurrency} ({r['served_retried']} 503s retried)")  # fmt: skip
    return [
        ("engine", r["engine_s"], r["engine"], f"{r['engine'] / r['st']:.2f}x",
         padding(r["engine_moved"]), r["diff"]),
        (served, r["served_s"], r["served"], vs("served"), None, None),
        ("batch (stages in process)", r["batch_s"], r["batch"], vs("batch"),
         padding(r["batch_moved"]), None),
        ("sentence-transformers `encode`", r["st_s"], r["st"], "1.00x", None, None),
    ]  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    r = embed_all(o)
    notes = (
        "a Qwen3-0.6B-shaped embedding model (random weights, float32, last-token pooling, "
        "Normalize; a sentence-transformers directory served with the shipped "
        "serve_config.yaml's settings, only `model` changed) embeds a mixed-length corpus: "
        f"{r['texts']} texts of log-uniform {o.min_tokens}..{o.max_tokens} tokens "
        f"({r['tokens']} real tokens), {r['layers']} decoder layers; warm-up {r['warm_s']:.0f} s",
        "engine: every text in one `score_batch` (inputs end to end in rows of "
        "`item_tokens_per_step` tokens, longest first); batch: `python -m batch embed`'s stages "
        "in process (tokenization, packing, the engine); sentence-transformers: `encode` with "
        "its default length-sorted batches of 32, torch on every core; served: the shipped app "
        "on a private Ray cluster, after one untimed round of requests",
        *where_the_time_goes(r),
    )
    tables = [table(COLUMNS, rows_of(r, o), missing="")]
    figures = {k: v for k, v in r.items() if k.endswith("_moved")}
    return [run.result("Embeddings", tables, key="embed", notes=notes, figures=figures)]


def where_the_time_goes(r: dict[str, Any]) -> list[str]:
    """The engine's own seconds and compiles in each run (served: the replica's)."""
    lines = []
    for name, seconds, moved in (
        ("engine", r["engine_s"], r["engine_moved"]),
        ("batch", r["batch_s"], r["batch_moved"]),
        ("served", r["served_s"], r["served_moved"]),
    ):
        lines.append(
            f"{name}: {moved['engine_seconds']:.1f} of its {seconds:.1f} s in engine steps; "
            f"{moved['request_path_compiles']} request-path and "
            f"{moved['background_compiles']} background compiles" + steps_and_padding(moved)
        )
    return lines


def steps_and_padding(moved: dict[str, float]) -> str:
    """The suffix '; N steps, padding P' where the counters hold steps (the replica's)."""
    return f"; {moved['steps']} steps, padding {padding(moved):.3f}" if "steps" in moved else ""


WORKLOAD = Workload(
    options=(
        Option("--texts", 2000), Option("--min-tokens", 8), Option("--max-tokens", 512),
        Option("--layers", 28, "decoder layers (Qwen3-0.6B: 28)"),
        Option("--per-request", 8, "texts a served request"),
        Option("--concurrency", 8, "served requests in flight"),
        Option("--port", 8000, "the served app's (if free)"),
    ),
    measure=measure,
)  # fmt: skip
