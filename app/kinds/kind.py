"""What a model kind's ingress half declares (``app/kinds/<name>.py``, one per
``replicas.kinds.ModelKind``): the workloads it answers and how, the ones it refuses with a
reason of its own, and the decoder reranker it is built with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.rerank import Reranker
from app.served import Answered, Served
from app.timings import Backend
from app.tokenization import TextTokenizer
from replicas.contract import ModelInfo
from replicas.settings import HttpSettings

# (what is served, the decoded body, the replica call) -> (the response body, its timings)
Answer = Callable[[Served, Any, Backend], Awaitable[Answered]]
# The /v1/rerank template reranker this kind builds from the settings, or None.
RerankerFor = Callable[[HttpSettings, TextTokenizer, ModelInfo], Reranker | None]


def no_reranker(http: HttpSettings, tokenizer: TextTokenizer, info: ModelInfo) -> None:
    """A kind that ranks without a template (cosine, a cross-encoder's pairs)."""
    return None


@dataclass(frozen=True)
class KindAnswers:
    """One kind's ingress half."""

    name: str
    """The replicas.kinds.ModelKind it answers for."""
    answers: Mapping[str, Answer]
    """Workload name (app.workloads) -> its answer: the workloads this kind serves (its
    OpenAPI document offers them); every other workload is a 400 ``unsupported_for_model``."""
    refusals: Mapping[str, Answer] = field(default_factory=dict)
    """Workloads refused with a reason of their own, after the body's rules (not offered)."""
    reranker: RerankerFor = no_reranker
    """How /v1/rerank's template reranker is built for this kind."""
    similarity: str | None = None
    """How /v1/score and /v1/rerank compare a query with an item when not by a template or
    a head (``cosine``, ``maxsim``, ``sparse_dot``, ``hybrid``; /v1/models' ``scoring``)."""

    @property
    def outputs(self) -> tuple[str, ...]:
        """What it embeds, by the routes it answers: ``vector`` (/v1/embeddings),
        ``tokens`` (/pooling), ``sparse`` (/embed_sparse)."""
        routes = (("embeddings", "vector"), ("pooling", "tokens"), ("embed_sparse", "sparse"))
        return tuple(output for workload, output in routes if workload in self.answers)
