"""The ingress's scoring logic without Ray: validate -> tokenize -> call a backend -> scores.

``ScoringService.score`` takes a decoded request body and an async backend that turns one
ScoreWork into ``[n_items, n_labels]`` log-probabilities (a DeploymentHandle in production, a
fake in unit tests) and returns the response body, or raises ScoringError.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.chunks import NO_CHUNKING, ChunkOptions
from app.classify import classify_body, prepare_classify, refuse_score_head
from app.completions import Completions
from app.cross_encoder import cross_encoded
from app.embed_scores import cosine_rerank_work, cosine_score_work
from app.embed_types import NO_CALIBRATION, Calibration, load_calibration
from app.embeddings import (
    Embedder,
    cohere_body,
    cosines,
    openai_body,
    refuse_kind,
)
from app.kinds import kinds_of
from app.model_card import models_body
from app.rerank import Reranker, rerank_body, reranker_for
from app.schema import ScoreRequest
from app.scores import head_scores, to_scores
from app.timings import Backend, Timings, replica_answer
from app.tokenization import TextTokenizer, Tokenized, encode_text, pass_tokens
from app.validation import (
    check_item_count,
    check_model_name,
    check_text_encodable,
    check_token_inputs,
    check_work,
    is_text_request,
    score_labels,
    validate_request,
)
from replicas.checkpoints.sources import load_hf_config, load_tokenizer, resolve_model_source
from replicas.contract import EmbedWork, ModelInfo, PromptLogprobs, PromptWork, ScoreWork
from replicas.errors import Reason, ScoringError
from replicas.model.head_config import score_head_from_hf, with_saved_activation
from replicas.model.pooling_config import served_pooling_head
from replicas.serving.setup import model_vocab_size
from replicas.settings import ReplicaSettings, check_delimiter_in_vocab


@dataclass(frozen=True)
class Prepared:
    """A request that passed every rule, ready for a replica."""

    request: ScoreRequest
    work: ScoreWork
    tokenized: Tokenized


@dataclass(frozen=True)
class ScoringService:
    info: ModelInfo
    tokenizer: TextTokenizer
    clock: Callable[[], float] = field(default=time.time)
    reranker: Reranker | None = None  # /v1/rerank; None: the model has no rerank template
    completions: Completions | None = None  # /v1/completions and the tokenizer routes
    chunking: ChunkOptions = NO_CHUNKING  # /v1/rerank's chunking defaults (app.chunks)
    calibration: Calibration = NO_CALIBRATION  # int8/uint8 embedding ranges (app.embed_types)

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
        info = ModelInfo(
            name=source.name,
            vocab_size=vocab_size,
            multi_item_scoring_delimiter=settings.model.multi_item_scoring_delimiter,
            limits=settings.limits,
            head=with_saved_activation(score_head_from_hf(hf_config), directory)
            if pooling is None
            else None,
            pooling=pooling,
            adapters=tuple(name for name, _ in settings.adapters.lora_adapters)
            if adapters is None
            else adapters,
        )
        tokenizer = load_tokenizer(source)
        ranks = info.kind in ("causal_lm", "score_head")  # by a template or its head
        return cls(
            info=info,
            tokenizer=tokenizer,
            # an embedding model ranks by cosine (app.embed_scores), not by a template
            reranker=reranker_for(settings.http, tokenizer, info.head) if ranks else None,
            completions=Completions(tokenizer, info),
            chunking=ChunkOptions.from_settings(settings.http),
            calibration=load_calibration(
                settings.http.embedding_calibration, pooling.dimension if pooling else None
            ),
        )

    @property
    def embedder(self) -> Embedder:
        return Embedder(self.info, self.tokenizer, self.calibration)

    def prepare(self, payload: Any) -> Prepared:
        """Every validation rule, in a fixed order; raises ScoringError on the first."""
        request = validate_request(payload)
        adapter = check_model_name(request.model, self.info)
        labels = score_labels(request.label_token_ids, self.info)
        text = is_text_request(request)
        check_item_count(len(request.items), self.info)
        if text:
            check_text_encodable(request)
            tokenized = encode_text(self.tokenizer, request.query, request.items)  # type: ignore[arg-type]
        else:
            check_token_inputs(request, self.info.vocab_size)
            tokenized = pass_tokens(request.query, request.items)  # type: ignore[arg-type]
        work = ScoreWork(
            query_ids=tokenized.query_ids,
            item_ids=tokenized.item_ids,
            label_ids=labels,
            item_first=request.item_first,
            adapter=adapter,
        )
        check_work(work, self.info)
        return Prepared(request, work, tokenized)

    async def score(self, payload: Any, backend: Backend) -> dict[str, Any]:
        """The /v1/score response body for ``payload``; ``items=[]`` never calls the backend."""
        body, _ = await self.score_timed(payload, backend)
        return body

    async def score_timed(self, payload: Any, backend: Backend) -> tuple[dict[str, Any], Timings]:
        """``score``, and where its time went."""
        if self.info.pooling is not None:
            return await self._cosine_scores(payload, backend)
        if self.info.kind == "cross_encoder":
            return await self._cross_encoded(payload, "/v1/score", backend)
        start = time.perf_counter()
        prepared = self.prepare(payload)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        scores: list[list[float]] = []
        if prepared.work.num_items:
            logprobs, timings = await self._scored(prepared.work, backend, timings)
            to_rows = to_scores if self.info.head is None else head_scores
            scores = to_rows(logprobs, prepared.request.apply_softmax)
        prompt_tokens = prepared.tokenized.prompt_tokens
        body = {
            "object": "scoring",
            "model": prepared.work.adapter or self.info.name,  # the adapter a request named
            "scores": scores,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 0,
                "total_tokens": prompt_tokens,
            },
            "created": int(self.clock()),
        }
        return body, timings

    async def rerank_timed(self, payload: Any, backend: Backend) -> tuple[dict[str, Any], Timings]:
        """The /v1/rerank response body for ``payload`` (app.rerank), and its timings."""
        if self.info.pooling is not None:
            return await self._cosine_rerank(payload, backend)
        if self.info.kind == "cross_encoder":
            return await self._cross_encoded(payload, "/v1/rerank", backend)
        if self.reranker is None:
            raise ScoringError(
                Reason.NOT_FOUND,
                f"model {self.info.name!r} has no rerank template (setting rerank_template)",
                status_code=404,
            )
        start = time.perf_counter()
        prepared = self.reranker.prepare(payload, self.info, self.chunking)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        relevance = np.zeros((0,), np.float64)
        if isinstance(prepared.work, PromptWork) and prepared.work.num_items:
            answers, timings = await self._prompted(prepared.work, backend, timings)
            relevance = self.reranker.relevance(prepared, answers)
        elif isinstance(prepared.work, ScoreWork) and prepared.work.num_items:
            logprobs, timings = await self._scored(prepared.work, backend, timings)
            relevance = self.reranker.relevance(prepared, logprobs)
        model = prepared.work.adapter or self.info.name
        body = self.reranker.body(prepared, relevance, model)
        return body, timings

    async def complete_timed(
        self, payload: Any, backend: Backend
    ) -> tuple[dict[str, Any], Timings]:
        """The /v1/completions response body for ``payload`` (app.completions), and timings."""
        completions = self.served_tokenizer()
        refuse_kind(self.info, "/v1/completions", *kinds_of("/v1/completions"))
        refuse_score_head(self.info, "/v1/completions")
        start = time.perf_counter()
        prompts = completions.prepare(payload)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        answers, timings = await self._prompted(prompts.work, backend, timings)
        return completions.body(prompts, answers, int(self.clock())), timings

    async def classify_timed(
        self, payload: Any, backend: Backend
    ) -> tuple[dict[str, Any], Timings]:
        """The /v1/classify response body for ``payload`` (app.classify), and its timings:
        every input one row, scored concurrently (the replica packs them into its steps)."""
        if self.info.kind == "cross_encoder":
            return await self._cross_encoded(payload, "/v1/classify", backend)
        refuse_kind(self.info, "/v1/classify", *kinds_of("/v1/classify"))
        start = time.perf_counter()
        prepared = prepare_classify(payload, self.info, self.tokenizer)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        answers = await asyncio.gather(
            *(self._scored(work, backend, timings) for work in prepared.works)
        )
        if answers:
            timings = answers[-1][1]
        outputs = np.concatenate([logits for logits, _ in answers]) if answers else None
        return classify_body(prepared, outputs, self.info, int(self.clock())), timings

    async def embed_timed(
        self, payload: Any, backend: Backend, cohere: bool = False
    ) -> tuple[dict[str, Any], Timings]:
        """The /v1/embeddings (``cohere``: /v2/embed) response body, and its timings."""
        start = time.perf_counter()
        texts: list[str] = []
        if cohere:
            prepared, texts = self.embedder.prepare_cohere(payload)
        else:
            prepared = self.embedder.prepare(payload)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        vectors, timings = await self._embedded(prepared.work, backend, timings)
        vectors = prepared.fold(vectors)
        if cohere:
            body = cohere_body(prepared, vectors, texts, uuid.uuid4().hex, self.calibration)
            return body, timings
        model = prepared.work.adapter or self.info.name
        return openai_body(prepared, vectors, model, self.calibration), timings

    async def _cosine_scores(
        self, payload: Any, backend: Backend
    ) -> tuple[dict[str, Any], Timings]:
        start = time.perf_counter()
        request, cosine = cosine_score_work(self.embedder, payload)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        scores: list[list[float]] = []
        tokens = 0
        if cosine is not None:
            vectors, timings = await self._embedded(cosine.work, backend, timings)
            scores = [[float(c)] for c in cosines(vectors[0], vectors[1:])]
            tokens = cosine.prompt_tokens
        usage = {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
        model = request.model or self.info.name  # checked: the base's name or an adapter's
        body = {"object": "scoring", "model": model, "scores": scores, "usage": usage}
        return {**body, "created": int(self.clock())}, timings

    async def _cosine_rerank(
        self, payload: Any, backend: Backend
    ) -> tuple[dict[str, Any], Timings]:
        start = time.perf_counter()
        request, cosine, chunks = cosine_rerank_work(self.embedder, payload, self.chunking)
        timings = Timings(tokenization_s=time.perf_counter() - start)
        relevance, tokens = np.zeros((0,), np.float64), 0
        if cosine is not None:
            vectors, timings = await self._embedded(cosine.work, backend, timings)
            relevance, tokens = cosines(vectors[0], vectors[1:]), cosine.prompt_tokens
        model = request.model or self.info.name
        return rerank_body(request, relevance, tokens, model, chunks), timings

    async def _cross_encoded(
        self, payload: Any, route: str, backend: Backend
    ) -> tuple[dict[str, Any], Timings]:
        """/v1/score, /v1/rerank or /v1/classify on a cross-encoder (app.cross_encoder)."""
        return await cross_encoded(
            self.tokenizer, self.info, payload, route, backend, self.clock, self.chunking
        )

    async def _embedded(
        self, work: EmbedWork, backend: Backend, timings: Timings
    ) -> tuple[np.ndarray, Timings]:
        """The replica's vectors ``[inputs, dimension]``, checked, and timings."""
        answer, timings = await replica_answer(work, backend, timings)
        vectors = np.asarray(answer, np.float32)
        assert self.info.pooling is not None
        expected = (work.num_items, self.info.pooling.dimension)
        if vectors.shape != expected or not np.isfinite(vectors).all():
            raise ScoringError(
                Reason.INTERNAL,
                f"replica returned {vectors.shape} vectors (finite: {np.isfinite(vectors).all()}), "
                f"expected {expected}",
                status_code=500,
            )
        return vectors, timings

    async def _prompted(
        self, work: PromptWork, backend: Backend, timings: Timings
    ) -> tuple[list[PromptLogprobs], Timings]:
        """The replica's PromptLogprobs, one per prompt, checked, and timings."""
        answer, timings = await replica_answer(work, backend, timings)
        if len(answer) != work.num_items:
            message = f"replica answered {len(answer)} prompts of {work.num_items}"
            raise ScoringError(Reason.INTERNAL, message, status_code=500)
        return list(answer), timings

    def served_tokenizer(self) -> Completions:
        """The completions and tokenizer routes' helper (404 when none was built)."""
        if self.completions is None:
            raise ScoringError(
                Reason.NOT_FOUND, "this server has no tokenizer routes", status_code=404
            )
        return self.completions

    async def _scored(
        self, work: ScoreWork, backend: Backend, timings: Timings
    ) -> tuple[np.ndarray, Timings]:
        """The replica's log-probabilities ``[n_items, n_labels]``, checked, and timings."""
        answer, timings = await replica_answer(work, backend, timings)
        logprobs = np.asarray(answer)
        expected = (work.num_items, len(work.label_ids))
        if logprobs.shape != expected:
            raise ScoringError(
                Reason.INTERNAL,
                f"replica returned shape {logprobs.shape}, expected {expected}",
                status_code=500,
            )
        if not np.isfinite(logprobs).all():
            raise ScoringError(
                Reason.INTERNAL, "replica returned non-finite log-probabilities", status_code=500
            )
        return logprobs, timings

    @property
    def text_query_min_length(self) -> int:
        """1 when "" encodes to no tokens (no BOS), so an empty text query is empty_query."""
        return 0 if len(self.tokenizer("", add_special_tokens=True)["input_ids"]) else 1

    def models_body(self) -> dict[str, Any]:
        """/v1/models (app.model_card)."""
        method = self.reranker.method if self.reranker else None
        return models_body(self.info, method, self.chunking, int(self.clock()))

    def model_card(self, name: str) -> dict[str, Any]:
        """/v1/models/{name}: the card /v1/models lists under ``name`` (the base model or a
        LoRA adapter); any other name is a 404 ``model_not_found``."""
        check_model_name(name, self.info)
        return next(card for card in self.models_body()["data"] if card["id"] == name)
