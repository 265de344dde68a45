"""The ingress's scoring logic without Ray: validate -> tokenize -> call a backend -> body.

``ScoringService.answer`` takes a workload (app.workloads), a decoded request body and an
async backend that turns one work into the replica's answer (a DeploymentHandle in
production, a fake in unit tests), and returns the response body and its timings through
the served model's kind (app.kinds), or raises ScoringError: a workload the kind does not
serve is a 400 ``unsupported_for_model`` before its body is read.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from app.chunks import ChunkOptions
from app.completions import Completions
from app.embed_types import load_calibration
from app.kinds import answers_of, kinds_serving
from app.model_card import models_body
from app.served import Answered, Prepared, Served
from app.timings import Backend, Timings
from app.validation import check_model_name
from app.workloads import WORKLOAD_NAMED, Workload
from replicas.checkpoints.sources import load_hf_config, load_tokenizer, resolve_model_source
from replicas.contract import ModelInfo
from replicas.errors import Reason, ScoringError
from replicas.kinds import served_parts
from replicas.model.head_config import score_head_from_hf, with_saved_activation
from replicas.model.pooling_config import served_pooling_head
from replicas.serving.setup import model_vocab_size
from replicas.settings import ReplicaSettings, check_delimiter_in_vocab

__all__ = ["Prepared", "ScoringService", "Timings"]


@dataclass(frozen=True)
class ScoringService(Served):
    @classmethod
    def from_settings(
        cls, settings: ReplicaSettings, adapters: Collection[str] | None = None
    ) -> ScoringService:
        """Load the model's tokenizer and vocabulary size from local files (jax-free).
        ``adapters``: the LoRA adapter names, when they change at run time (else
        ``lora_adapters``')."""
        source = resolve_model_source(settings.model.name)
        hf_config = load_hf_config(source)
        vocab_size = model_vocab_size(hf_config)
        check_delimiter_in_vocab(settings.model, vocab_size, source.name)
        directory = None if source.is_gguf else source.directory
        pooling = served_pooling_head(directory, hf_config, settings.model)
        head, pooling = served_parts(
            with_saved_activation(score_head_from_hf(hf_config), directory), pooling
        )
        info = ModelInfo(
            name=source.name,
            vocab_size=vocab_size,
            multi_item_scoring_delimiter=settings.model.multi_item_scoring_delimiter,
            limits=settings.limits,
            head=head,
            pooling=pooling,
            adapters=tuple(name for name, _ in settings.adapters.lora_adapters)
            if adapters is None
            else adapters,
        )
        tokenizer = load_tokenizer(source)
        return cls(
            info=info,
            tokenizer=tokenizer,
            reranker=answers_of(info).reranker(settings.http, tokenizer, info),
            completions=Completions(tokenizer, info),
            chunking=ChunkOptions.from_settings(settings.http),
            calibration=load_calibration(
                settings.http.embedding_calibration, pooling.dimension if pooling else None
            ),
        )

    async def answer(self, workload: Workload, payload: Any, backend: Backend) -> Answered:
        """``workload``'s response body for ``payload``, and where its time went."""
        if workload.answer is not None:
            return await workload.answer(self, payload, backend)
        kind = answers_of(self.info)
        answer = kind.answers.get(workload.name) or kind.refusals.get(workload.name)
        if answer is None:
            route, serving = workload.paths[0], kinds_serving(workload.name)
            raise ScoringError(
                Reason.UNSUPPORTED_FOR_MODEL,
                f"{route}: model {self.info.name!r} is a {self.info.kind} model; {route} "
                f"serves {' and '.join(serving)} models",
            )
        return await answer(self, payload, backend)

    async def score(self, payload: Any, backend: Backend) -> dict[str, Any]:
        """The /v1/score response body for ``payload``; ``items=[]`` never calls the backend."""
        body, _ = await self.score_timed(payload, backend)
        return body

    async def score_timed(self, payload: Any, backend: Backend) -> Answered:
        return await self.answer(WORKLOAD_NAMED["score"], payload, backend)

    async def rerank_timed(self, payload: Any, backend: Backend) -> Answered:
        return await self.answer(WORKLOAD_NAMED["rerank"], payload, backend)

    async def complete_timed(self, payload: Any, backend: Backend) -> Answered:
        return await self.answer(WORKLOAD_NAMED["completions"], payload, backend)

    async def classify_timed(self, payload: Any, backend: Backend) -> Answered:
        return await self.answer(WORKLOAD_NAMED["classify"], payload, backend)

    async def embed_timed(self, payload: Any, backend: Backend, cohere: bool = False) -> Answered:
        """/v1/embeddings (``cohere``: /v2/embed)."""
        return await self.answer(
            WORKLOAD_NAMED["embed" if cohere else "embeddings"], payload, backend
        )

    def models_body(self) -> dict[str, Any]:
        """/v1/models (app.model_card)."""
        method = self.reranker.method if self.reranker else None
        return models_body(self.info, method, self.chunking, int(self.clock()))

    def model_card(self, name: str) -> dict[str, Any]:
        """/v1/models/{name}: the card /v1/models lists under ``name`` (the base model or a
        LoRA adapter); any other name is a 404 ``model_not_found``."""
        check_model_name(name, self.info)
        return next(card for card in self.models_body()["data"] if card["id"] == name)
