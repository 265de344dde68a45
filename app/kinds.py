"""Which model kinds (``ModelInfo.kind``) each route serves, stated once: the OpenAPI
document offers a route only to the kinds that serve it (``Workload.kinds``, app.workloads),
and the ingress answers the other kinds a 400 (``refuse_kind``, app.embeddings): a kind in
``OWN_REASON`` with the route's own reason (classify on a causal LM: ``no_score_head``;
completions on a score-head model: ``no_lm_head``), every other one
``unsupported_for_model`` naming the route and the kind."""

from __future__ import annotations

KINDS = ("causal_lm", "score_head", "embedding", "cross_encoder")

# A route's first path -> the kinds that serve it; a route not named here serves every kind.
SERVED_BY: dict[str, tuple[str, ...]] = {
    "/v1/embeddings": ("embedding",),
    "/v2/embed": ("embedding",),
    "/v1/classify": ("score_head", "cross_encoder"),
    "/v1/completions": ("causal_lm",),
}
# The kinds a route refuses with a reason of its own, after the kind check lets them by.
OWN_REASON: dict[str, tuple[str, ...]] = {
    "/v1/classify": ("causal_lm",),  # no_score_head (app.classify.head_of)
    "/v1/completions": ("score_head",),  # no_lm_head (app.classify.refuse_score_head)
}


def served_kinds(route: str) -> tuple[str, ...]:
    """The kinds that ``route`` answers (every body refused: not these)."""
    return SERVED_BY.get(route, KINDS)


def kinds_of(route: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``refuse_kind``'s kinds for ``route``: those it serves, and those it refuses with
    its own reason."""
    return served_kinds(route), OWN_REASON.get(route, ())
