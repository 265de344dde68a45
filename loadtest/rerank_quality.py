"""Rerank quality on a relevance set: top-1, pairwise accuracy and NDCG@4 per method.

The set (tests/data/rerank_relevance/queries.jsonl, written for scorejax) holds queries with
four documents each, graded 2 (answers the query), 1 (on the topic) or 0 (unrelated). Both
``rerank_method`` values run on the shipped model through the ingress's own rerank code and
the engine (no Ray, no HTTP): relevance exactly as /v1/rerank computes it.

    python -m loadtest run rerank_quality [--model SmolLM2-135M-Instruct] [--templates]

``--templates`` also measures the query_likelihood prompts the shipped default was chosen
from. A "chance" row gives each figure's expectation under a uniformly random order.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.query_likelihood import UPR_DOCUMENT
from loadtest.harness import ROOT, TOOL_RESULTS, Option, Result, Run, Workload, col, table

RELEVANCE_SET = ROOT / "tests" / "data" / "rerank_relevance" / "queries.jsonl"
METHODS = ("yes_no", "query_likelihood")
# query_likelihood prompts around a document (each followed by " {query}") measured beside
# the default ("{document}\nQuestion:", BARE_DOCUMENT): UPR's own (Sachan et al., 2022) and
# two more.
TEMPLATES = {
    "UPR's": UPR_DOCUMENT,
    "Document: ... A search query this document answers:": (
        "Document: {document}\nA search query this document answers:"
    ),
    "Passage: ... This passage is about:": "Passage: {document}\nThis passage is about:",
}


@dataclass(frozen=True)
class Judged:
    query: str
    documents: tuple[str, ...]
    grades: tuple[int, ...]


def relevance_set(path: Path = RELEVANCE_SET) -> list[Judged]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Judged(r["query"], tuple(r["documents"]), tuple(r["grades"])) for r in rows]


def ndcg(grades: Sequence[int], scores: Sequence[float], k: int = 4) -> float:
    """NDCG@k with gains 2^grade - 1 and ties broken by document order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    ideal = sorted(grades, reverse=True)[:k]

    def dcg(gains: Sequence[int]) -> float:
        return sum((2**g - 1) / math.log2(rank + 2) for rank, g in enumerate(gains))

    best = dcg(ideal)
    return dcg([grades[i] for i in order]) / best if best else 0.0


def quality(judged: Sequence[Judged], scores: Sequence[Sequence[float]]) -> dict[str, float]:
    """top-1: the best-graded document ranked first; pairwise: of document pairs with
    different grades, the share ranked in grade order (ties count half); NDCG@4."""
    top1, pairs, right, gains = 0, 0, 0.0, []
    for item, score in zip(judged, scores, strict=True):
        best = max(range(len(score)), key=lambda i: (score[i], -i))
        top1 += item.grades[best] == max(item.grades)
        for i in range(len(score)):
            for j in range(len(score)):
                if item.grades[i] > item.grades[j]:
                    pairs += 1
                    right += 1.0 if score[i] > score[j] else 0.5 if score[i] == score[j] else 0.0
        gains.append(ndcg(item.grades, score))
    return {
        "queries": len(judged),
        "top1": top1 / len(judged),
        "pairwise": right / pairs,
        "ndcg4": float(np.mean(gains)),
    }


def rerank_scores(
    service: Any, score_batch: Callable[[list], list], judged: Sequence[Judged]
) -> list[list[float]]:
    """Each query's relevance by document index, through ``service.rerank_timed``: every
    query's request at once, their works scored together by ``score_batch`` (an engine's:
    as concurrent requests share steps; an answer never depends on its step's other works)."""
    payloads = [{"query": item.query, "documents": list(item.documents)} for item in judged]
    bodies = asyncio.run(_together(service, score_batch, payloads))
    out = []
    for item, body in zip(judged, bodies, strict=True):
        by_index = {r["index"]: r["relevance_score"] for r in body["results"]}
        out.append([by_index[i] for i in range(len(item.documents))])
    return out


async def _together(service: Any, score_batch: Callable[[list], list], payloads: list) -> list:
    """``service.rerank_timed`` of every payload concurrently; whenever every request waits on
    its backend call, the waiting works run as one ``score_batch``."""
    waiting: list[tuple[Any, asyncio.Future]] = []

    async def backend(work: Any) -> Any:
        answer = asyncio.get_running_loop().create_future()
        waiting.append((work, answer))
        return await answer

    tasks = [asyncio.ensure_future(service.rerank_timed(p, backend)) for p in payloads]
    while not all(task.done() for task in tasks):
        await asyncio.sleep(0)  # each request runs up to its backend call (no I/O between)
        if waiting:
            batch, waiting[:] = list(waiting), []
            answers = score_batch([work for work, _ in batch])
            for (_, future), answer in zip(batch, answers, strict=True):
                future.set_result(answer)
    return [task.result()[0] for task in tasks]


def chance(judged: Sequence[Judged]) -> dict[str, float]:
    """Each figure's expectation over every order of each query's documents."""
    per_query = []
    for item in judged:
        n = len(item.documents)
        orders = [
            [float(n - order.index(i)) for i in range(n)]
            for order in itertools.permutations(range(n))
        ]
        per_query.append([quality([item], [scores]) for scores in orders])
    mean = lambda key: float(np.mean([np.mean([q[key] for q in qs]) for qs in per_query]))  # noqa: E731
    return {"queries": len(judged), **{key: mean(key) for key in ("top1", "pairwise", "ndcg4")}}


def measure(
    model: str, judged: Sequence[Judged], templates: bool = False
) -> dict[str, dict[str, float]]:
    """Figures per row: each method with its default prompt, with ``templates`` every
    query_likelihood prompt of TEMPLATES, and chance."""
    from app.service import ScoringService
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    rows: dict[str, ReplicaSettings] = {}
    base = ReplicaSettings.from_keys(model=model, multi_item_scoring_delimiter=0)
    for method in METHODS:
        rows[f"`{method}`, default prompt"] = base.replace(rerank_method=method)
    for name, document in TEMPLATES.items() if templates else ():
        rows[f"`query_likelihood`, {name}"] = base.replace(
            rerank_method="query_likelihood", rerank_template=(("document", document),)
        )
    results = {}
    for label, settings in rows.items():
        engine = ScoringEngine.from_settings(settings, warm=False)
        service = ScoringService.from_settings(settings)
        results[label] = quality(judged, rerank_scores(service, engine.score_batch, judged))
    results["chance (a random order)"] = chance(judged)
    return results


COLUMNS = (
    col("rerank_method, prompt", left=True), col("queries", "d"), col("top-1", ".3f"),
    col("pairwise accuracy", ".3f"), col("NDCG@4", ".3f"),
)  # fmt: skip


def measure_all(o: argparse.Namespace, run: Run) -> list[Result]:
    results = measure(o.model, relevance_set(), o.templates)
    rows = [(k, r["queries"], r["top1"], r["pairwise"], r["ndcg4"]) for k, r in results.items()]
    title = f"Rerank quality on the relevance set, {o.model}"
    return [run.result(title, [table(COLUMNS, rows)], figures=results)]


WORKLOAD = Workload(
    options=(
        Option("--model", "SmolLM2-135M-Instruct"),
        Option("--templates", False, "every TEMPLATES prompt too"),
    ),
    measure=measure_all,
    out=TOOL_RESULTS,
)
