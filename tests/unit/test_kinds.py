"""The model kinds are one registry (replicas/kinds.py) with one ingress half each
(app/kinds/): exactly one kind recognizes any checkpoint, both halves name the same kinds,
and no code outside the kind modules decides by a model's kind: it reads the kind's
capabilities (``ModelKind.embeds``, ``lm_head``, ``pairs``, ``vectors``) instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.kinds import INGRESS_HALVES, kinds_serving
from app.workloads import WORKLOADS
from replicas.contract import ModelInfo, PoolingHead, ScoreHead, ScoringLimits
from replicas.embed_contract import Hybrid, LateInteraction, SparseOutput
from replicas.kinds import KINDS, kind_named, recognize

ROOT = Path(__file__).resolve().parents[2]
HEADS = {
    "none": None,
    "linear": ScoreHead("linear", 2, ("a", "b")),
    "reward_mlp": ScoreHead("reward_mlp", 1, ("reward",)),
    "cross_encoder": ScoreHead("cross_encoder", 1, ("relevance",), activation="sigmoid"),
}
POOLINGS = {
    "vector": PoolingHead("mean", True, 8),
    "tokens": PoolingHead("tokens", True, 8, late=LateInteraction(query_length=8)),
    "sparse": PoolingHead("splade", False, 64, sparse=SparseOutput(max_active_dims=4)),
    "hybrid": PoolingHead("cls", True, 8, hybrid=Hybrid(colbert_dimension=8)),
}
EXPECTED = {  # (head, pooling) -> kind
    ("none", None): "causal_lm",
    ("linear", None): "score_head",
    ("reward_mlp", None): "score_head",
    ("cross_encoder", None): "cross_encoder",
    **{(head, "vector"): "embedding" for head in HEADS},
    **{(head, "tokens"): "late_interaction" for head in HEADS},
    **{(head, "sparse"): "sparse" for head in HEADS},
    **{(head, "hybrid"): "hybrid" for head in HEADS},
}
# A kind check: a model's kind read by name, or what it is read from the head's or the
# pooling's presence. Outside the kind modules, code reads the kind's capabilities.
KIND_CHECKS = re.compile(
    r"info\.kind\s*(==|!=|in\b|not in\b)"
    r"|\binfo\.(head|pooling)\s+is\b"
    r"|\.kind\s*(==|!=)\s*\"cross_encoder\""
    r"|\"(causal_lm|score_head|cross_encoder)\""
)
CHECKED = ("app", "batch", "replicas/serving", "replicas/engine")
KIND_MODULES = ("app/kinds/",)


@pytest.mark.parametrize(("head", "pooled"), sorted(EXPECTED, key=str))
def test_exactly_one_kind_recognizes_each_head_and_pooling(head: str, pooled: str | None) -> None:
    pooling = POOLINGS.get(pooled) if pooled else None
    found = [kind.name for kind in KINDS if kind.recognizes(HEADS[head], pooling)]
    assert found == [EXPECTED[head, pooled]]
    assert recognize(HEADS[head], pooling).name == EXPECTED[head, pooled]


def test_model_info_reads_its_kind_from_the_registry() -> None:
    for (head, pooled), name in EXPECTED.items():
        pooling = POOLINGS[pooled] if pooled else None
        info = ModelInfo("m", 64, None, ScoringLimits(), HEADS[head], pooling)
        assert info.kind == name and info.model_kind is kind_named(name)
    with pytest.raises(KeyError, match="causal_lm"):
        kind_named("colpali")


def test_both_halves_name_the_same_kinds_and_every_answer_a_workload() -> None:
    assert list(INGRESS_HALVES) == [kind.name for kind in KINDS]
    names = {workload.name for workload in WORKLOADS}
    for half in INGRESS_HALVES.values():
        assert set(half.answers) <= names and set(half.refusals) <= names, half.name
        assert not set(half.answers) & set(half.refusals), half.name
    for workload in WORKLOADS:  # every workload is served by some kind
        assert kinds_serving(workload.name), workload.name


def test_capabilities_say_what_each_kind_runs() -> None:
    embeds = {kind.name for kind in KINDS if kind.embeds}
    assert embeds == {"embedding", "cross_encoder", "late_interaction", "sparse", "hybrid"}
    outputs = {kind.name: kind.output for kind in KINDS if kind.embeds}
    assert outputs == {
        "embedding": "vector", "cross_encoder": "vector", "late_interaction": "tokens",
        "sparse": "sparse", "hybrid": "hybrid",
    }  # fmt: skip
    assert [kind.name for kind in KINDS if kind.lm_head] == ["causal_lm"]
    assert [kind.name for kind in KINDS if kind.vectors] == ["embedding"]


def test_no_kind_check_outside_the_kind_modules() -> None:
    found = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(KIND_MODULES):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if KIND_CHECKS.search(line.split("#")[0]):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
