"""Quantized scoring's quality gate and speed (issue 60, docs/quantization.md): each
``quantization`` form against float32 on the same (the shipped model's) weights, through the
engine in this process (no Ray, no HTTP).

    python -m loadtest run quant_quality [--model M] [--forms int8,int8_smooth] [--speed]
        [--matmuls] [--no-quality] [--repeats 7]

Quality, per form: the rerank relevance set's 34 queries as /v1/score requests whose labels
are the whole vocabulary (each item's label distribution is the model's full next-token
distribution): KL(float32 || form), the largest |log-prob difference| over the 10 most likely
tokens, top-token agreement; /v1/rerank (``yes_no``) on the same set: top-1 unchanged,
Spearman to float32's scores, top-1 against the grades; embeddings (pooled by the last
token): cosine to float32's. Targets (the issue): mean KL <= 1e-3, the rerank set's top-1
unchanged, cosine >= 0.999. ``--speed``: engine steps of each form beside float32 and bf16 on
the shipped settings; ``--matmuls``: SmolLM2's projections alone (qwix's too where found).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loadtest.harness import Option, Result, Run, Table, Workload, col, table, timed_together
from loadtest.rerank_quality import Judged, quality, relevance_set, rerank_scores

QUALITY_DOC = "docs/quantization.md"
TARGETS = {"kl_mean": 1e-3, "cosine_min": 0.999}
# One query bucket and one item bucket, no fused rows: every request of the set runs on the
# same few compiled signatures (the figures do not depend on shapes beyond the float32 floor).
ONE_SHAPE = {"token_buckets": (128,), "item_token_buckets": (128,), "fused_step_tokens": 0}
EMBED_CHUNK = 64  # inputs per EmbedWork (under max_items_per_request)
TOP_TOKENS = 10  # |log-prob difference| over each distribution's most likely tokens


def distribution_works(tokenizer: Any, judged: Sequence[Judged], vocab: int) -> list[Any]:
    """One ScoreWork a query: its documents as items, every token id a label."""
    from replicas.contract import ScoreWork

    encode = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    labels = tuple(range(vocab))
    query = lambda j: encode(f"Query: {j.query}\nDocument:")  # noqa: E731
    return [
        ScoreWork(query(j), tuple(encode(" " + d) for d in j.documents), labels) for j in judged
    ]


def _rank(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(np.float64)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    ra, rb = _rank(np.asarray(a)), _rank(np.asarray(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom else 1.0


def distribution_figures(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """ref, got: ``[n, V]`` log-probs -> KL(ref || got) mean and p99, the largest |difference|
    over each row's ``TOP_TOKENS`` most likely tokens, and top-token agreement."""
    kl = (np.exp(ref) * (ref - got)).sum(-1)  # [n]
    top = np.argsort(-ref, axis=-1)[:, :TOP_TOKENS]
    diff = np.abs(np.take_along_axis(ref, top, -1) - np.take_along_axis(got, top, -1))
    return {
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.quantile(kl, 0.99)),
        "max_abs_logprob_top10": float(diff.max()),
        "top_token_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
    }


def rerank_figures(ref: list[list[float]], got: list[list[float]], judged: Any) -> dict:
    pairs = list(zip(ref, got, strict=True))
    return {
        "rerank_top1_unchanged": sum(int(np.argmax(a)) == int(np.argmax(b)) for a, b in pairs),
        "rerank_spearman_mean": float(np.mean([spearman(a, b) for a, b in pairs])),
        "rerank_top1_vs_grades": quality(judged, got)["top1"],
    }


def _embed(settings: Any, texts: list[tuple[int, ...]]) -> np.ndarray:
    from replicas.embed_contract import EmbedWork
    from replicas.engine.scoring_engine import ScoringEngine

    engine = ScoringEngine.from_settings(settings.replace(pooling="lasttoken"), warm=False)
    chunks = [
        EmbedWork(tuple(texts[i : i + EMBED_CHUNK])) for i in range(0, len(texts), EMBED_CHUNK)
    ]
    return np.concatenate([np.asarray(v, np.float64) for v in engine.score_batch(chunks)])


def measure_form(model: str, form: str, judged: Sequence[Judged], run: Run) -> dict[str, Any]:
    """Everything the gate compares, for one form: distributions, rerank scores, vectors."""
    from app.service import ScoringService
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    settings = ReplicaSettings.from_keys(model=model, multi_item_scoring_delimiter=0,
                                         rerank_method="query_likelihood", quantization=form,
                                         **ONE_SHAPE)  # fmt: skip
    engine = ScoringEngine.from_settings(settings, warm=False)
    service = ScoringService.from_settings(settings)
    works = distribution_works(service.tokenizer, judged, engine.info.vocab_size)
    run.say(f"{form}: {len(works)} requests of {len(works[0].label_ids)} labels")
    dists = np.concatenate([engine.score_batch([w])[0] for w in works])  # [items, V]
    run.say(f"{form}: distributions done; rerank and embeddings")
    reranked = rerank_scores(service, engine.score_batch, judged)
    texts = [item for w in works for item in w.item_ids]
    return {"dists": dists, "rerank": reranked, "embed": _embed(settings, texts)}


def compare(ref: dict[str, Any], got: dict[str, Any], judged: Any) -> dict[str, Any]:
    a, b = ref["embed"], got["embed"]
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    figures = {
        **distribution_figures(ref["dists"], got["dists"]),
        **rerank_figures(ref["rerank"], got["rerank"], judged),
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
    }
    figures["met"] = (
        figures["kl_mean"] <= TARGETS["kl_mean"]
        and figures["rerank_top1_unchanged"] == len(judged)
        and figures["cosine_min"] >= TARGETS["cosine_min"]
    )
    return figures


QUALITY_COLUMNS = (
    col("quantization", left=True), col("KL mean", ".2e"), col("KL p99", ".2e"),
    col("max abs dlogp (top 10)", ".4f"), col("top token agrees", ".3f"),
    col("rerank top-1 unchanged", left=True), col("Spearman", ".4f"),
    col("top-1 vs grades", ".3f"), col("cosine min", ".5f"), col("cosine mean", ".5f"),
    col("targets met", left=True),
)  # fmt: skip


def quality_result(o: argparse.Namespace, run: Run) -> Result:
    judged = relevance_set()
    forms = [f for f in o.forms.split(",") if f]
    measured = {form: measure_form(o.model, form, judged, run) for form in ["none", *forms]}
    figures = {f: compare(measured["none"], measured[f], judged) for f in forms}
    figures["none"] = {"rerank_top1_vs_grades": quality(judged, measured["none"]["rerank"])["top1"]}
    rows = [("none (float32)", *[None] * 6, figures["none"]["rerank_top1_vs_grades"], *[None] * 3)]
    for form in forms:
        f = figures[form]
        rows.append((
            form, f["kl_mean"], f["kl_p99"], f["max_abs_logprob_top10"],
            f["top_token_agreement"], f"{f['rerank_top1_unchanged']}/{len(judged)}",
            f["rerank_spearman_mean"], f["rerank_top1_vs_grades"], f["cosine_min"],
            f["cosine_mean"], "yes" if f["met"] else "no",
        ))  # fmt: skip
    notes = (
        f"{len(judged)} queries x 4 documents: {4 * len(judged)} next-token distributions "
        "over the whole vocabulary, against float32 on the same weights",
        "targets: mean KL <= 1e-3, the rerank set's top-1 unchanged, cosine >= 0.999",
    )
    title = f"Quantized scoring against float32, {o.model}"
    return run.result(title, [table(QUALITY_COLUMNS, rows)], key="quant-quality",
                      doc=QUALITY_DOC, notes=notes, figures=figures)  # fmt: skip


SPEED_CASES = {
    "100 items, 300-token query": (100, 300, 10),
    "2 items, 9-token query": (2, 9, 1),
}


def against(seconds: Mapping[str, Mapping[str, float]], first: str, base: str, ratio: str) -> Table:
    """A row per contender: its ms in each case and ``base``'s seconds over its own."""
    names = list(next(iter(seconds.values())))
    rows = [(name, *(v for s in seconds.values() for v in (s[name] * 1e3, s[base] / s[name])))
            for name in names]  # fmt: skip
    columns = [col(first, left=True)]
    for case in seconds:
        columns += [col(f"{case}: ms", ".1f"), col(ratio, ".2f", "x")]
    return table(columns, rows)


def speed_result(o: argparse.Namespace, run: Run) -> Result:
    from loadtest.bench_common import make_work, shipped_settings
    from replicas.engine.scoring_engine import ScoringEngine

    base = shipped_settings().replace(model=o.model)
    variants = {"none": base, "none, bfloat16": base.replace(dtype="bfloat16")}
    variants.update({f: base.replace(quantization=f) for f in o.forms.split(",") if f})
    engines = {name: ScoringEngine.from_settings(s, warm=False) for name, s in variants.items()}
    seconds: dict[str, Mapping[str, float]] = {}
    for case, shape in SPEED_CASES.items():
        work = make_work(*shape)
        for engine in engines.values():  # the work's own signature compiled first
            engine.score_batch([work])
            engine.score_batch([work])
            engine.wait_for_background_compiles()
        calls = {name: (lambda e=e, w=work: e.score_batch([w])) for name, e in engines.items()}
        seconds[case] = timed_together(calls, o.repeats, shuffle=True)
        run.say(f"{case}: {seconds[case]}")
    notes = (
        f"engine steps only (no HTTP), the shipped settings with `quantization` (or dtype) "
        f"changed; medians of {o.repeats} rounds, every form timed in turn each round, in "
        "an order of its own each round",
    )
    title = f"Quantized scoring speed on this CPU, {o.model}"
    tables = [against(seconds, "form", "none", "speed-up vs none")]
    return run.result(title, tables, key="quant-speed", doc=QUALITY_DOC, notes=notes,
                      figures=seconds)  # fmt: skip


# ----------------------------------------------------------------------------- matmuls

SMOLLM2_PROJECTIONS = {"q": (576, 576), "k": (576, 192), "v": (576, 192), "o": (576, 576),
                       "gate": (576, 1536), "up": (576, 1536), "down": (1536, 576)}  # fmt: skip
MATMUL_TOKENS = (16, 400)


def _projection(form: str) -> Any:
    """(x [T, in], weight) -> [T, out] float32 for one form; the weight as ``_weights``."""
    import jax.numpy as jnp

    from replicas.model.quant import quantized_project

    if form in ("float32", "bfloat16"):
        return lambda x, w: (x.astype(w.dtype) @ w).astype(jnp.float32)
    if form.startswith("qwix"):
        import qwix  # not a dependency: a scratch install measured beside ours

        def qwix_proj(x: Any, w: Any) -> Any:
            lhs = qwix.quantize(x, jnp.int8, channelwise_axes=(0,)) if "W8A8" in form else x
            return qwix.dot_general(lhs, w, (((1,), (0,)), ((), ())))

        return qwix_proj
    return lambda x, w: quantized_project(x, w[0], w[1], 1, form, jnp.float32)


def _weights(form: str, layers: int) -> dict[str, Any]:
    """Random stacked weights ``[layers, in, out]`` of every projection, stored for ``form``."""
    import jax.numpy as jnp

    from replicas.model.quant import quantize

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name, shape in SMOLLM2_PROJECTIONS.items():
        w = (0.04 * rng.standard_normal((layers, *shape))).astype(np.float32)
        if form in ("float32", "bfloat16"):
            out[name] = jnp.asarray(w, form)
        elif form.startswith("qwix"):
            import qwix

            out[name] = qwix.quantize(jnp.asarray(w), jnp.int8, channelwise_axes=(0, 2))
        else:
            out[name] = tuple(jnp.asarray(a) for a in quantize(w, 1, form, lead=1, xp=np))
    return out


def projection_chain(form: str, layers: int = 30) -> Any:
    """A jitted x [T, 576] -> x through ``layers`` layers of SmolLM2's 7 projections (a norm,
    attention's q/k/v/o without the attention, the gated MLP): the matmuls alone."""
    import jax

    proj, weights = _projection(form), _weights(form, layers)

    def layer(x: Any, w: dict[str, Any]) -> tuple[Any, Any]:
        x = x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        q, k, v = (proj(x, w[n]) for n in "qkv")
        mlp = proj(jax.nn.silu(proj(x, w["gate"])) * proj(x, w["up"]), w["down"])
        return x + proj(q, w["o"]) + mlp, (k, v)

    run = jax.jit(lambda x, ws: jax.lax.scan(layer, x, ws)[0])
    return lambda x: run(x, weights).block_until_ready()


def matmul_result(o: argparse.Namespace, run: Run) -> Result:
    import importlib.util

    import jax.numpy as jnp

    forms = ["float32", "bfloat16", "int8", "int8_weight"]
    if importlib.util.find_spec("qwix") is not None:
        forms += ["qwix int8 W8A8", "qwix int8 weight-only"]
    chains = {form: projection_chain(form) for form in forms}
    seconds = {}
    for tokens in MATMUL_TOKENS:
        x = jnp.asarray(np.random.default_rng(1).standard_normal((tokens, 576)), jnp.float32)
        calls = {form: (lambda c=c, x=x: c(x)) for form, c in chains.items()}
        seconds[tokens] = timed_together(calls, o.repeats, shuffle=True)
        run.say(f"{tokens} tokens: {seconds[tokens]}")
    notes = (
        "SmolLM2's 210 projections (30 layers x q, k, v, o, gate, up, down) as one scanned "
        f"chain on random weights, jitted; medians of {o.repeats} rounds, timed in turn, "
        "in an order of its own each round",
        "qwix rows only where qwix is importable (a scratch install, not a dependency)",
    )
    title = "The projections alone on this CPU: float32, bfloat16, int8 forms, qwix"
    tables = [against({f"{t} tokens": s for t, s in seconds.items()}, "projections", "float32",
                      "vs float32")]  # fmt: skip
    return run.result(title, tables, key="quant-matmuls", doc=QUALITY_DOC, notes=notes,
                      figures={str(t): s for t, s in seconds.items()})  # fmt: skip


def measure_all(o: argparse.Namespace, run: Run) -> list[Result]:
    results = [quality_result(o, run)] if o.quality else []
    if o.matmuls:
        results.append(matmul_result(o, run))
    if o.speed:
        results.append(speed_result(o, run))
    return results


WORKLOAD = Workload(
    options=(
        Option("--model", "SmolLM2-135M-Instruct"),
        Option("--forms", "int8,int8_smooth,int8_weight", "quantization forms beside none"),
        Option("--no-quality", True, "skip the quality gate"),
        Option("--speed", False, "also time engine steps of every form"),
        Option("--matmuls", False, "also time SmolLM2's projections alone (qwix too if found)"),
        Option("--repeats", 7, "rounds timed with --speed"),
    ),
    measure=measure_all,
)
