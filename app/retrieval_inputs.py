"""Texts -> EmbedWork for late-interaction and sparse models, as sentence-transformers 6.2's
``MultiVectorEncoder`` and ``SparseEncoder`` prepare them (semantics 20), and what the
ingress computes from their answers: MaxSim and sparse dot products.

A text's role (``query`` or ``document``) picks its prompt (the model's prompt of that name;
a rerank ``instruction`` in the query's place) and, on a late-interaction model, its length:
a query is cut to the expansion length (``fixed``) or its ``query_length``, then filled
with the expansion token (the tokenizer's mask token) up to the expansion length, those
fill tokens query-only unless the model attends to them; a document is cut to its
``document_length``. Every input is cut to the model's ``max_seq_length``. Of a document's
token vectors, those of skiplist tokens (words resolved to single token ids as
``MultiVectorMask`` resolves them) are left out of its vectors and its scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from app.embed_inputs import CHARS_PER_TOKEN
from app.validation import check_item_count, check_unicode
from replicas.contract import EmbedWork, ModelInfo, PoolingHead, check_embed_limits
from replicas.embed_contract import LateInteraction
from replicas.errors import Reason, ScoringError

ROLES = ("query", "document")


def head_of(info: ModelInfo) -> PoolingHead:
    """The served late-interaction or sparse head (only those kinds' answers call this)."""
    return cast(PoolingHead, info.pooling)


def skiplist_ids(tokenizer: Any, late: LateInteraction) -> frozenset[int]:
    """The skiplist's words as token ids, as ``MultiVectorMask.resolve_with_tokenizer``: a
    word that is not one token of the vocabulary (the unknown token's id) is dropped."""
    unknown, unknown_token = tokenizer.unk_token_id, tokenizer.unk_token
    ids = (tokenizer.convert_tokens_to_ids(word) for word in late.skiplist)
    words = zip(late.skiplist, ids, strict=True)
    return frozenset(i for w, i in words if i is not None and (i != unknown or w == unknown_token))


def expansion_id(tokenizer: Any, late: LateInteraction) -> int:
    """The fill token: the named one, else the mask token, else end of sequence."""
    if late.expansion_token is not None:
        return int(tokenizer.convert_tokens_to_ids(late.expansion_token))
    token = tokenizer.mask_token_id
    return int(token if token is not None else tokenizer.eos_token_id)


def _cut_to(head: PoolingHead, role: str, limit: int) -> int:
    late = head.late
    if late is None:
        return limit
    if role == "query":
        fixed = late.query_length if late.expansion == "fixed" else None
        return min(limit, fixed or late.query_max_length or limit)
    return min(limit, late.document_length or limit)


@dataclass(frozen=True)
class RoleInputs:
    """Texts of one role as token ids, and each input's query-only fill tokens."""

    inputs: tuple[tuple[int, ...], ...]
    query_only: tuple[int, ...]


def encode_role(
    tokenizer: Any, texts: Sequence[str], role: str, prompt: str | None, head: PoolingHead,
    limit: int, param: str, cut: bool = True,
) -> RoleInputs:  # fmt: skip
    """Each text behind ``prompt`` with the tokenizer's special tokens, cut as its role
    says (``cut`` False: a text past ``limit`` is a 400 naming ``param``), a
    late-interaction query filled to its expansion length."""
    keep = _cut_to(head, role, limit) if cut or head.late is not None else limit + 1
    width = (keep + 1) * CHARS_PER_TOKEN  # a longer text is cut before it is tokenized
    full = [f"{prompt}{text[:width]}" if prompt else text[:width] for text in texts]
    ids = tokenizer(full, add_special_tokens=True, truncation=True, max_length=keep)["input_ids"]
    inputs = [tuple(int(t) for t in row) for row in ids]
    if any(len(row) > limit for row in inputs):
        raise ScoringError(
            Reason.SEQUENCE_TOO_LONG,
            f"{param}: a text of more than the model's {limit} tokens (truncate cuts it)",
            param,
        )
    late, fill = head.late, [0] * len(inputs)
    if late is not None and role == "query" and late.query_length is not None:
        token = expansion_id(tokenizer, late)
        fill = [max(0, late.query_length - len(row)) for row in inputs]
        inputs = [row + (token,) * n for row, n in zip(inputs, fill, strict=True)]
        if late.attend_expansion:
            fill = [0] * len(inputs)
    return RoleInputs(tuple(inputs), tuple(fill))


def request_texts(value: str | Sequence[str], info: ModelInfo, param: str) -> list[str]:
    """A request's text or texts, each non-empty valid Unicode, not more than the model
    takes (400s naming ``param``)."""
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise ScoringError(Reason.EMPTY_INPUT, f"{param}: the list is empty", param)
    check_item_count(len(texts), info)
    check_texts(texts, param)
    return texts


def check_texts(texts: Sequence[str], param: str) -> None:
    for text in texts:
        if not text:
            raise ScoringError(Reason.EMPTY_INPUT, f"{param}: empty text is not embedded", param)
        check_unicode(text, param)


def role_prompt(head: PoolingHead, role: str, instruction: str | None = None) -> str | None:
    """The prompt of a text of ``role`` (a query's ``instruction`` in its place)."""
    if role == "query" and instruction is not None:
        return instruction
    return head.prompt(role)


def embed_work(parts: Sequence[RoleInputs], info: ModelInfo, param: str) -> EmbedWork:
    """One EmbedWork of ``parts`` in order, asking for the model's output, checked against
    the limits (a 400 naming ``param``)."""
    head = head_of(info)
    inputs = tuple(row for part in parts for row in part.inputs)
    query_only = tuple(n for part in parts for n in part.query_only)
    work = EmbedWork(inputs, output=head.output, query_only=query_only if any(query_only) else ())
    try:
        check_embed_limits(work, info.limits, head.max_seq_length)
    except ScoringError as error:
        raise ScoringError(error.reason, error.message, param) from None
    return work


def scored_tokens(
    vectors: np.ndarray, ids: Sequence[int], role: str, late: LateInteraction,
    skip: frozenset[int],
) -> np.ndarray:  # fmt: skip
    """An input's token vectors ``[tokens, D]`` less its skiplist tokens (in the roles the
    skiplist applies to): what ``MultiVectorEncoder.encode`` returns for it."""
    if role not in late.skiplist_tasks or not skip:
        return vectors
    keep = np.fromiter((t not in skip for t in ids), bool, len(ids))
    return vectors[keep]


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray], late: LateInteraction) -> np.ndarray:
    """Each document's MaxSim with ``query [q, D]`` (float64): per query token the best
    dot product over the document's tokens, summed (``meanmaxsim``: averaged); a document
    with no scored token scores 0."""
    q = np.asarray(query, np.float64)
    scores = np.zeros(len(documents), np.float64)
    for i, doc in enumerate(documents):
        if len(doc):
            scores[i] = (q @ np.asarray(doc, np.float64).T).max(axis=1).sum()
    return scores / max(len(q), 1) if late.similarity == "meanmaxsim" else scores


def sparse_dots(query: tuple[np.ndarray, np.ndarray], documents: Sequence[Any]) -> np.ndarray:
    """Each sparse document's dot product with the sparse query (float64)."""
    q_indices, q_values = query
    scores = np.zeros(len(documents), np.float64)
    for i, (indices, values) in enumerate(documents):
        _, qi, di = np.intersect1d(q_indices, indices, assume_unique=True, return_indices=True)
        scores[i] = np.dot(np.asarray(q_values, np.float64)[qi], np.asarray(values, np.float64)[di])
    return scores


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The tokens BGE-M3's lexical weights leave out: [CLS], end of sequence, padding and
    the unknown token (FlagEmbedding's ``unused_tokens``)."""
    names = ("cls_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
    return frozenset(int(i) for i in (getattr(tokenizer, n, None) for n in names) if i is not None)


def lexical_weights(
    ids: Sequence[int], weights: np.ndarray, specials: frozenset[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token weights ``[n]`` -> each token id's largest positive weight, specials left
    out: (indices ascending int32, values float32), a sparse vector over the vocabulary."""
    best: dict[int, float] = {}
    for token, weight in zip(ids, np.asarray(weights, np.float32).tolist(), strict=True):
        if token not in specials and weight > 0 and weight > best.get(token, 0.0):
            best[token] = weight
    indices = np.asarray(sorted(best), np.int32)
    return indices, np.asarray([best[i] for i in indices.tolist()], np.float32)
