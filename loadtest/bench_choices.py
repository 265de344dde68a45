"""Benchmark: multiple-choice log-likelihood (/v1/completions), prefix reuse on and off.

The workload is what lm-evaluation-harness sends for a multiple-choice task. Each question is
a 300-token context with 4 choices of 5-30 tokens. Every (context, choice) pair is one prompt,
sorted as lm-eval sorts them (longest first), 8 prompts per request (``batch_size=8``), each
with ``echo, logprobs 1, max_tokens 1``. It reports choices/s and tokens computed / prompt
tokens, and checks each choice's log-likelihood against reuse off and against lm-eval's ``hf``
model (transformers, fp32, same weights), which runs the same requests side by side.

Engine mode (``make bench``): the shipped serve_config.yaml's replica settings with
``prefix_reuse`` on and off. HTTP mode (``make bench URL=...``): a running server
(``make serve``), with its /v1/stats counters. An untimed pass of other questions of the same
lengths compiles the shapes first; the timed questions share no tokens with it.

    python -m loadtest run choices [--questions 16] [--url URL] [--no-hf]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtest.harness import MODEL, Option, Result, Run, col, table, timed_once
from loadtest.harness import Workload as Declared

Pair = tuple[tuple[int, ...], tuple[int, ...]]  # (context, continuation) token ids
Runner = Callable[[list[list[int]]], list[Any]]  # prompts -> each prompt's token log-probs


@dataclass(frozen=True)
class Questions:
    pairs: list[Pair]  # lm-eval's order: longest first
    batch: int

    @property
    def requests(self) -> list[list[Pair]]:
        return [self.pairs[i : i + self.batch] for i in range(0, len(self.pairs), self.batch)]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(c) + len(x) for c, x in self.pairs)


def workload(questions: int, context: int, choices: int, seed: int, batch: int = 8) -> Questions:
    """Lengths from a fixed stream (every seed has the same shapes), tokens from ``seed``."""
    lengths = np.random.default_rng(0).integers(5, 31, (questions, choices))
    rng = np.random.default_rng(seed)
    pairs = []
    for row in lengths:
        ctx = tuple(int(t) for t in rng.integers(100, 40000, context))
        pairs += [(ctx, tuple(int(t) for t in rng.integers(100, 40000, n))) for n in row]
    pairs.sort(key=lambda p: (-len(p[0] + p[1]), p[0] + p[1]))  # lm-eval's _collate
    return Questions(pairs, batch)


def continuation_logliks(pairs: Sequence[Pair], token_logprobs: Sequence[Sequence[Any]]) -> list:
    """Each pair's continuation log-likelihood from its prompt's echoed token log-probs (as
    lm-eval reads them: ``token_logprobs[ctxlen:]`` of the prompt)."""
    return [
        float(np.sum(np.asarray(lp, np.float64)[len(ctx) : len(ctx) + len(cont)]))
        for (ctx, cont), lp in zip(pairs, token_logprobs, strict=True)
    ]


def run_pass(load: Questions, run: Runner) -> tuple[float, list[Any]]:
    """Seconds for every request in order, and each prompt's echoed token log-probs."""
    prompts = [[list(ctx + cont) for ctx, cont in request] for request in load.requests]
    return timed_once(lambda: [lp for request in prompts for lp in run(request)])


def engine_runners() -> dict[str, tuple[Runner, Callable[[], dict]]]:
    """Reuse on (as shipped) and off: a runner and a stats source each."""
    from loadtest.bench_common import build_engines, config_settings
    from replicas.contract import PromptWork

    shipped = config_settings().replace(
        compilation_cache_dir=None,  # every run compiles alike
        warmup_shapes=(),  # /v1/score's shapes: no completion runs on them
        limit_to_warmup=False,
    )
    modes = {"reuse on": True, "reuse off": False}
    variants = {name: shipped.replace(prefix_reuse=reuse) for name, reuse in modes.items()}
    engines, _ = build_engines(shipped, variants, MODEL)
    runners = {}
    for name, engine in engines.items():
        engine.warmup()

        def run(prompts: list[list[int]], engine: Any = engine) -> list[Any]:
            [answers] = engine.score_batch([PromptWork(tuple(map(tuple, prompts)), top_k=1)])
            engine.wait_for_background_compiles()
            return [a.token_logprobs for a in answers]

        runners[name] = (run, lambda engine=engine: engine.stats().as_dict())
    return runners


def http_runner(url: str) -> tuple[Runner, Callable[[], dict]]:
    import httpx

    client = httpx.Client(base_url=url, timeout=600)

    def run(prompts: list[list[int]]) -> list[Any]:
        body = {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
        reply = client.post("/v1/completions", json=body)
        reply.raise_for_status()
        choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
        return [
            [np.nan if x is None else x for x in c["logprobs"]["token_logprobs"]] for c in choices
        ]

    return run, lambda: client.get("/v1/stats").json()


def lm_eval_hf_runner() -> Callable[[Sequence[Pair]], list[float]]:
    """lm-eval's ``hf`` model on the same weights: its own batching and sorting."""
    from lm_eval.models.huggingface import HFLM

    from loadtest.peers import load_hf_model
    from replicas.checkpoints.sources import load_tokenizer, resolve_model_source

    tokenizer = load_tokenizer(resolve_model_source(MODEL))
    lm = HFLM(pretrained=load_hf_model(), tokenizer=tokenizer, batch_size=8, device="cpu")

    def run(pairs: Sequence[Pair]) -> list[float]:
        requests = [(("", ""), list(ctx), list(cont)) for ctx, cont in pairs]
        return [ll for ll, _ in lm._loglikelihood_tokens(requests, disable_tqdm=True)]

    return run


def measure_mode(
    name: str, run: Runner, stats: Callable[[], dict], warm: Questions, timed: Questions
) -> dict:
    run_pass(warm, run)  # compiles the shapes; its prefixes share nothing with ``timed``
    before = stats()
    seconds, logprobs = run_pass(timed, run)
    after = stats()
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in after if isinstance(after[k], int)}
    return {
        "mode": name,
        "seconds": seconds,
        "choices_per_s": len(timed.pairs) / seconds,
        "computed_ratio": grown.get("computed_prompt_tokens", 0) / timed.prompt_tokens,
        "padded_ratio": grown.get("computed_tokens", 0) / timed.prompt_tokens,
        "logliks": continuation_logliks(timed.pairs, logprobs),
    }


COLUMNS = (
    col("mode", left=True), col("choices", "d"), col("seconds", ".1f"), col("choices/s", ".2f"),
    col("vs reuse off", ".2f", "x"), col("tokens computed / prompt tokens", ".2f"),
    col("with padding", ".2f"), col("max abs diff vs reuse off", ".1e"),
    col("max abs diff vs lm-eval hf", ".1e"),
)  # fmt: skip


def row_cells(row: dict, off: dict | None, hf: dict | None, choices: int) -> tuple:
    def diff(other: dict | None) -> float | None:
        if other is None or other is row:
            return None
        return float(np.abs(np.subtract(row["logliks"], other["logliks"])).max())

    speed = None if off is None else row["choices_per_s"] / off["choices_per_s"]
    ours = not row["mode"].startswith("lm-eval")
    return (row["mode"], choices, row["seconds"], row["choices_per_s"], speed,
            row["computed_ratio"] if ours else None, row["padded_ratio"] if ours else None,
            diff(off), diff(hf))  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    warm = workload(o.questions, o.context_tokens, 4, seed=1)
    timed = workload(o.questions, o.context_tokens, 4, seed=2)
    runners = {"HTTP, served": http_runner(o.url)} if o.url else engine_runners()
    rows = [measure_mode(name, r, stats, warm, timed) for name, (r, stats) in runners.items()]
    off = next((r for r in rows if r["mode"] == "reuse off"), None)
    hf = None
    if o.hf:
        hf_run = lm_eval_hf_runner()
        hf_run(warm.pairs[:8])
        seconds, logliks = timed_once(lambda: hf_run(timed.pairs))
        hf = {"mode": "lm-eval hf (transformers)", "seconds": seconds, "logliks": logliks,
              "choices_per_s": len(timed.pairs) / seconds}  # fmt: skip
        rows.append(hf)
    cells = [row_cells(r, off, hf, len(timed.pairs)) for r in rows]
    where = "over HTTP against `make serve`" if o.url else "engine only, shipped settings"
    notes = (
        f"{where}; {MODEL}, float32",
        f"{o.questions} questions, a {o.context_tokens}-token context and 4 choices of 5-30 "
        f"tokens each ({len(timed.pairs)} prompts, {timed.prompt_tokens} prompt tokens), in "
        "lm-eval's order (longest first), 8 prompts per request, one request at a time, "
        "`echo, logprobs 1, max_tokens 1`; an untimed pass over other questions of the same "
        "lengths compiles the shapes first",
        "tokens computed: prompt tokens the model ran (`computed_prompt_tokens`); with padding: "
        "every token of every step (`computed_tokens`); lm-eval hf: "
        "`HFLM(batch_size=8)._loglikelihood_tokens` on the same requests; max abs diff: of each "
        "choice's log-likelihood",
    )
    title = "Multiple choice: prompt log-likelihood with prefix reuse" + (
        ", over HTTP" if o.url else ""
    )
    key = "choices-served" if o.url else "choices"
    return [run.result(title, [table(COLUMNS, cells)], key=key, notes=notes)]


WORKLOAD = Declared(
    url=True,
    options=(
        Option("--questions", 16), Option("--context-tokens", 300),
        Option("--no-hf", True, "skip lm-eval's hf model"),
    ),
    measure=measure,
)  # fmt: skip
