"""Every benchmark and tool, by name: the module that declares it (its ``WORKLOAD``) and what
it measures. ``python -m loadtest list`` prints this without importing any of them."""

from __future__ import annotations

import importlib
from dataclasses import replace

from loadtest.harness import Workload

REGISTRY: dict[str, tuple[str, str]] = {
    "engine": ("bench_engine", "the engine's single-item, shared-prefix and packed-reference "
               "layouts beside transformers, shipped settings (make bench)"),
    "serve": ("bench_serve", "a running server over HTTP: multi-item, its own single-item "
              "path, transformers; query cache, compiles, targets (make bench URL=...)"),
    "choices": ("bench_choices", "multiple-choice log-likelihood (/v1/completions), prefix "
                "reuse on and off, beside lm-eval's hf model; engine or --url"),
    "batch": ("bench_batch", "batch scoring of RFC-008 rows as a dataset: engine, batch jobs "
              "(local, serve), HTTP per row and per group, transformers"),
    "embed": ("bench_embed", "embeddings of a mixed-length corpus: engine, batch stages, "
              "served app, sentence-transformers"),
    "encoder": ("bench_encoder", "encoders (a bge-m3-shaped XLM-RoBERTa): embed and "
                "cross-encoder rerank through engine, batch, served app, sentence-transformers, "
                "Infinity"),
    "encoder_served": ("bench_encoder_served", "an encoder of a real shape (MiniLM, BERT-base) "
                       "served at 4 requests in flight beside sentence-transformers in process "
                       "and the engine; where the served time goes"),
    "retrieval_served": ("bench_retrieval", "a ColBERT (/v1/rerank, MaxSim) and a SPLADE "
                         "(/embed_sparse) of BERT-base's width served beside "
                         "sentence-transformers in process; padding, max diff"),
    "small": ("bench_small", "a small request: engine, served, transformers, llama.cpp; the "
              "floor of a weight pass and the step costs"),
    "llamacpp_served": ("bench_llamacpp_served", "a running server from its first request on "
                        "against llama.cpp on the same GGUF: 2, 10 and 100 items, a fresh "
                        "query each, compiles per request (--server names its tree)"),
    "small_breakdown": ("bench_small_breakdown", "where a small request's step goes: the host's "
                        "phases, the executable's ops by kind (a trace), pieces jitted alone"),
    "hop": ("bench_hop", "a small request between client and engine: routes, its timing "
            "headers' parts, Ray Serve's own floor, the ingress in process (--url)"),
    "layer_loop": ("bench_layer_loop", "the decoder's layer loop, scan against unrolled and auto: "
                   "fused steps of 16..256 tokens and the warm-up, shipped settings"),
    "heads": ("bench_heads", "best-of-N reward scoring with a score head: multi-item, each "
              "conversation alone, transformers"),
    "families": ("bench_engine", "RFC-008 on a Gemma-3-1B-shaped random model: multi-item, "
                 "single-item, transformers"),
    "rerank": ("bench_rerank", "/v1/rerank documents/s over HTTP at 10 and 100 documents"),
    "long_rerank": ("bench_long_rerank", "long documents ranked by their chunks: one chunked "
                    "/v1/rerank, pre-cut chunks as documents, a request per chunk"),
    "lora": ("bench_lora", "LoRA adapters mixed in one step (dense, grouped) beside the base "
             "model and one adapter a step"),
    "gpu": ("bench_gpu", "RFC-008 on a Qwen3-0.6B-shaped model in bf16 on a GPU: multi-item, "
            "single-item, XLA attention, transformers"),
    "tpu_table": ("tpu_table", "planning.tpu_check's roofline projection for every model x "
                  "topology (docs/tpu.md)"),
    "shuffle": ("bench_shuffle", "which Ray Data operator groups a dataset's rows by query"),
    "sweep": ("presets", "open-loop Poisson load sweep of a running server (make loadtest)"),
    "load": ("presets", "bounded closed-loop load and fuzz of a running server "
             "(make loadtest-closed)"),
    "overload": ("overload", "capacity, then open-loop overload of a running server"),
    "soak": ("soak", "mixed closed-loop soak of a running server with its RSS (make soak)"),
    "fuzz": ("fuzz", "generated bodies against the in-process ingress or --url (make fuzz)"),
    "burst": ("presets", "a burst of small requests right after a large one"),
    "first_minute": ("presets", "RFC-008 from a server's first request on, cold"),
    "rerank_quality": ("rerank_quality", "rerank quality (top-1, pairwise, NDCG@4) on the "
                       "relevance set"),
    "served_ab": ("bench_served_ab", "two running servers (two trees) side by side: the same "
                  "requests in turn on each, RFC-008's served shapes and a rerank"),
    "request_walk": ("request_walk", "the functions and files one /v1/score request runs "
                     "through (ingress, replica, engine), traced, for one tree or several"),
    "quant_quality": ("quant_quality", "quantized scoring (int8 forms) against float32: "
                      "KL, rerank, cosine; with --speed engine steps"),
}  # fmt: skip


def workload(name: str) -> Workload:
    """The declared workload ``name`` (its module imported now: its ``PRESETS[name]``, else
    its ``WORKLOAD``); KeyError if unknown."""
    module, summary = REGISTRY[name]
    declared = importlib.import_module(f"loadtest.{module}")
    declared = getattr(declared, "PRESETS", {}).get(name, declared.WORKLOAD)
    return replace(declared, name=name, summary=summary)
