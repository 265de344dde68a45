"""/v1/rerank (semantics 11): Cohere/Jina-shaped reranking with a yes/no LLM reranker.

A rerank request is one multi-item scoring request: the query part of a per-model template
(instruction and query) is the shared query, each document's part of the template is an item,
and the labels are the template's "yes" and "no" tokens. A document's relevance is
P(yes) / (P(yes) + P(no)) after its row, so all documents behind one query take one pass and
score as if each were scored alone. The default template is Qwen3-Reranker's.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.chunks import NO_CHUNKING, ChunkOptions, Chunks, request_chunks
from app.query_likelihood import LikelihoodTemplate, likelihood_prompts, likelihood_relevance
from app.schema import RerankRequest
from app.templates import template_from_pairs
from app.tokenization import TextTokenizer, encode_text
from app.validation import (
    check_item_count,
    check_model_name,
    check_unicode,
    check_work,
    validate_body,
)
from replicas.contract import (
    ModelInfo,
    PromptWork,
    ScoreHead,
    ScoreWork,
    check_limits,
)
from replicas.errors import ScoringError
from replicas.settings import HttpSettings, SettingsError

logger = logging.getLogger(__name__)

QWEN3_RERANKER_SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)


@dataclass(frozen=True)
class RerankTemplate:
    """How a (query, document) pair becomes a prompt whose next token is "yes" or "no"."""

    query: str = QWEN3_RERANKER_SYSTEM + "<Instruct>: {instruction}\n<Query>: {query}\n"
    document: str = (
        "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    yes: str = "yes"
    no: str = "no"
    instruction: str = "Given a web search query, retrieve relevant passages that answer the query"

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, str]]) -> RerankTemplate:
        """From the ``rerank_template`` setting; a wrong key or placeholder names it."""
        slots = {"query": "{query}", "document": "{document}"}
        return template_from_pairs(cls, pairs, slots, "yes_no")

    def label_ids(self, tokenizer: TextTokenizer) -> tuple[int, int]:
        """The token ids of the yes and no words; each must be exactly one token."""
        ids = []
        for field in ("yes", "no"):
            word = getattr(self, field)
            encoded = tokenizer(word, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise SettingsError(
                    f"rerank_template.{field}: {word!r} is {len(encoded)} tokens for this "
                    "tokenizer; it must be exactly one"
                )
            ids.append(int(encoded[0]))
        return ids[0], ids[1]


@dataclass(frozen=True)
class RerankWork:
    """A validated rerank request, its work for a replica (a ScoreWork for yes_no, a
    PromptWork for query_likelihood) and the tokens the model reads."""

    request: RerankRequest
    work: ScoreWork | PromptWork
    prompt_tokens: int
    chunks: Chunks  # the texts scored: the documents, or their chunks (app.chunks)


@dataclass(frozen=True)
class Reranker:
    """The configured method and template bound to a tokenizer: requests in, work and
    response bodies out."""

    template: RerankTemplate | LikelihoodTemplate
    tokenizer: TextTokenizer
    # yes_no: the yes and no token ids; head: (0,), the one output of a seq-cls reranker
    labels: tuple[int, ...] = (0, 0)

    @classmethod
    def build(
        cls, pairs: Sequence[tuple[str, str]], tokenizer: TextTokenizer, method: str = "yes_no"
    ) -> Reranker:
        if method == "query_likelihood":
            return cls(LikelihoodTemplate.from_pairs(pairs), tokenizer)
        template = RerankTemplate.from_pairs(pairs)
        if method == "head":  # the template's query and document parts; no yes/no words
            return cls(template, tokenizer, (0,))
        return cls(template, tokenizer, template.label_ids(tokenizer))

    @property
    def method(self) -> str:
        if isinstance(self.template, LikelihoodTemplate):
            return "query_likelihood"
        return "head" if self.labels == (0,) else "yes_no"

    def prepare(
        self, payload: Any, info: ModelInfo, defaults: ChunkOptions = NO_CHUNKING
    ) -> RerankWork:
        """Validate, chunk (``defaults``: the config's chunking) and tokenize."""
        request = validate_body(payload, RerankRequest)
        adapter = check_model_name(request.model, info)
        check_item_count(len(request.documents), info)
        chunks = request_chunks(self.tokenizer, request, defaults, info)
        texts = list(chunks.texts)
        for param, text in (("query", request.query), *(("documents", t) for t in texts)):
            check_unicode(text, param)
        if isinstance(self.template, LikelihoodTemplate):
            work = likelihood_prompts(self.template, self.tokenizer, request.query, texts)
            work = dataclasses.replace(work, adapter=adapter)
            _check(work, info)
            return RerankWork(request, work, sum(len(p) for p in work.prompts), chunks)
        template = self.template
        query = template.query.format(
            instruction=request.instruction or template.instruction, query=request.query
        )
        check_unicode(query, "instruction")
        items = [template.document.format(document=text) for text in texts]
        tokenized = encode_text(self.tokenizer, query, items)
        work = ScoreWork(tokenized.query_ids, tokenized.item_ids, self.labels, adapter=adapter)
        _check(work, info)
        return RerankWork(request, work, tokenized.prompt_tokens, chunks)

    def body(self, prepared: RerankWork, relevance: np.ndarray, model: str) -> dict[str, Any]:
        request, tokens = prepared.request, prepared.prompt_tokens
        return rerank_body(request, relevance, tokens, model, prepared.chunks)


def work_relevance(work: ScoreWork | PromptWork, answer: Any) -> np.ndarray:
    """Each scored text's (document's or chunk's) relevance in [0, 1] from the replica's
    answer: P(yes) / (P(yes) + P(no)) from the label log-probs (yes_no), the sigmoid of a
    one-label head's logit (head), or the query's per-token likelihood (query_likelihood);
    the work's labels say the method (``(0,)`` a head, two ids yes/no; a PromptWork
    query_likelihood), so a batch job's engine stage computes it from token ids too."""
    if isinstance(work, PromptWork):
        return likelihood_relevance(work, answer)
    logprobs = np.asarray(answer)
    if work.label_ids == (0,):
        return 1.0 / (1.0 + np.exp(-logprobs[:, 0].astype(np.float64)))
    yes, no = logprobs[:, 0].astype(np.float64), logprobs[:, 1].astype(np.float64)
    return 1.0 / (1.0 + np.exp(no - yes))


def reranker_for(
    http: HttpSettings, tokenizer: TextTokenizer, head: ScoreHead | None = None
) -> Reranker | None:
    """The configured method and template (a wrong one stops start-up, naming
    ``rerank_template``); unset, the method's default template (for yes_no only where the
    tokenizer has one-token yes/no words, else None: no rerank). A score-head model ranks
    only with ``head`` (its default when the head has one label) and no other method."""
    method = http.rerank_method
    if head is not None or method == "head":
        return head_reranker(http, tokenizer, head)
    if http.rerank_template or method != "yes_no":
        return Reranker.build(http.rerank_template, tokenizer, method)
    try:
        return Reranker.build((), tokenizer)
    except SettingsError:
        return None


def head_reranker(
    http: HttpSettings, tokenizer: TextTokenizer, head: ScoreHead | None
) -> Reranker | None:
    """rerank_method head: a one-label score head, relevance = sigmoid(logit)."""
    method = http.rerank_method
    if head is None:
        raise SettingsError("rerank_method: head needs a model with a score head")
    if method != "head":  # the shipped config's method, with only `model` changed
        logger.info(
            "rerank_method: %r reads token log-probs, which a score-head model has not; "
            "ignored: documents rank by the head",
            method,
        )
    if head.num_labels != 1:
        if method == "head":
            raise SettingsError(
                f"rerank_method: head needs a one-label head; this one has {head.num_labels}"
            )
        return None
    return Reranker.build(http.rerank_template if method == "head" else (), tokenizer, "head")


def _check(work: ScoreWork | PromptWork, info: ModelInfo) -> None:
    """The shared limits, their errors naming ``documents`` where they name the items."""
    if isinstance(work, PromptWork):
        try:
            check_limits(work, info.limits, multi_item=True)
        except ScoringError as error:
            raise ScoringError(error.reason, error.message, "documents") from None
        return
    try:
        check_work(work, info)
    except ScoringError as error:
        param = "documents" if error.param == "items" else error.param
        raise ScoringError(error.reason, error.message, param, error.status_code) from None


def rerank_body(
    request: RerankRequest,
    relevance: np.ndarray,
    prompt_tokens: int,
    model: str,
    chunks: Chunks | None = None,
) -> dict[str, Any]:
    """Cohere's response shape (Jina's and TEI's fields are a subset): results by
    relevance, best first, ``top_n`` of them. ``relevance``: one per scored text, folded
    into one per document by ``chunks`` (None: the texts are the documents)."""
    spans = None
    if chunks is not None:
        relevance, spans = chunks.fold(relevance)
    order = sorted(range(len(relevance)), key=lambda i: (-relevance[i], i))
    results = []
    for index in order[: request.top_n or len(order)]:
        result: dict[str, Any] = {"index": index, "relevance_score": float(relevance[index])}
        if request.return_documents:
            document = request.documents[index]
            text = document if isinstance(document, str) else document.text
            result["document"] = {"text": text}
        if spans is not None:
            result["relevant_spans"] = spans[index]
        results.append(result)
    units = chunks.search_units if chunks is not None else 1
    return {
        "id": uuid.uuid4().hex,
        "model": model,
        "results": results,
        "meta": {
            "billed_units": {"search_units": units},
            "tokens": {"input_tokens": prompt_tokens},
        },
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
