"""The ingress halves of the model kinds (replicas.kinds), one module each: how a served
model of that kind answers each workload. ``answers_of`` is the one dispatch; the workloads
a kind serves are the keys of its ``answers`` (app.workloads offers a route to those
kinds only)."""

from __future__ import annotations

from app.kinds import (
    causal_lm,
    cross_encoder,
    embedding,
    hybrid,
    late_interaction,
    score_head,
    sparse,
)
from app.kinds.kind import Answer, KindAnswers
from replicas.contract import ModelInfo
from replicas.kinds import KINDS

INGRESS_HALVES: dict[str, KindAnswers] = {
    kind.name: kind
    for kind in (
        causal_lm.KIND,
        score_head.KIND,
        embedding.KIND,
        cross_encoder.KIND,
        late_interaction.KIND,
        sparse.KIND,
        hybrid.KIND,
    )
}

__all__ = ["Answer", "KindAnswers", "answers_of", "kinds_serving"]


def answers_of(info: ModelInfo) -> KindAnswers:
    """The served model's kind's ingress half."""
    return INGRESS_HALVES[info.kind]


def kinds_serving(workload: str) -> tuple[str, ...]:
    """The kinds that serve ``workload`` (answer it, not refuse it), in KINDS' order."""
    return tuple(kind.name for kind in KINDS if workload in INGRESS_HALVES[kind.name].answers)
