"""/v1/rerank with ``rerank_method: query_likelihood``: documents ranked by how likely the
model finds the query after each document (UPR: Sachan et al., 2022, "Improving Passage
Retrieval with Zero-Shot Question Generation").

Each document becomes one prompt, ``template.document`` (with ``{document}``) followed by
``template.query`` (with ``{query}``); the replica scores the query part's tokens
(``PromptWork`` with ``scored_tail``, /v1/completions' engine path) and the relevance is the
exponential of the mean log-probability of those tokens: in (0, 1], monotone in that mean, and
``exp(-mean NLL)``, the query's per-token likelihood. Documents are separate prompts, so a
document's relevance never depends on the others or their order. Prompts that share whole
blocks (a long template opening) compute them once; the others run whole, packed many to a
step as the items of one item stream (``keep_lone_prefixes=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.templates import template_from_pairs
from app.tokenization import TextTokenizer
from replicas.contract import PromptLogprobs, PromptWork
from replicas.errors import Reason, ScoringError

# The default prompt, chosen by measurement on SmolLM2-135M-Instruct (docs/serving.md,
# "Reranking": top-1 1.000, NDCG@4 0.996 on tests/data/rerank_relevance against 0.912 / 0.979
# for UPR's own prompt, UPR_DOCUMENT, which stays one setting away).
BARE_DOCUMENT = "{document}\nQuestion:"
UPR_DOCUMENT = "Passage: {document}\nPlease write a question based on this passage.\nQuestion:"


@dataclass(frozen=True)
class LikelihoodTemplate:
    """The prompt around a document, and the query part whose tokens are scored."""

    document: str = BARE_DOCUMENT
    query: str = " {query}"

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, str]]) -> LikelihoodTemplate:
        """From ``rerank_template`` with ``rerank_method: query_likelihood``."""
        slots = {"document": "{document}", "query": "{query}"}
        return template_from_pairs(cls, pairs, slots, "query_likelihood")


def likelihood_prompts(
    template: LikelihoodTemplate, tokenizer: TextTokenizer, query: str, documents: list[str]
) -> PromptWork:
    """Documents encoded with the tokenizer's special tokens, the query part without, joined
    as token ids (so the query's tokens are the same after every document)."""
    query_ids = tokenizer(template.query.format(query=query), add_special_tokens=False)
    scored = tuple(int(t) for t in query_ids["input_ids"])
    if not scored:
        raise ScoringError(Reason.EMPTY_QUERY, "query has no tokens", "query")
    texts = [template.document.format(document=document) for document in documents]
    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
    prompts = tuple(tuple(int(t) for t in ids) + scored for ids in encoded)
    # Documents rarely recur: each runs whole, many per step, nothing kept for later; the LM
    # head runs at the query's tokens only.
    return PromptWork(prompts, keep_lone_prefixes=False, scored_tail=len(scored))


def likelihood_relevance(work: PromptWork, answers: Sequence[PromptLogprobs]) -> np.ndarray:
    """``exp(mean log P(query token | document, query tokens before))`` per document: the
    query's tokens are each prompt's ``scored_tail``."""
    tail = work.scored_tail
    means = [float(np.mean(np.asarray(a.token_logprobs[-tail:], np.float64))) for a in answers]
    return np.exp(np.asarray(means, np.float64))
