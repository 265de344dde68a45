"""What ``embed`` and ``rerank`` do on a late-interaction, a sparse or a hybrid model (a
kind whose EmbedWork asks for ``tokens``, ``sparse`` or ``hybrid``, ``ModelKind.output``),
with the ingress's own code (app.retrieval_inputs, app.retrieval_scores, app.kinds.hybrid):

- a row's text prepared as /pooling (late interaction) or /embed_sparse (sparse, hybrid)
  prepares it, in the job's role (``--input-type``), and its answer written as those routes
  answer it: ``embedding`` (one float32 vector per scored token: a document's skiplist
  tokens left out) or ``sparse_indices`` and ``sparse_values``; a hybrid model's one pass
  as /v1/embeddings (``embedding``), /pooling (``token_embeddings``) and /embed_sparse
  (``sparse_indices``, ``sparse_values``) answer it, the parts ``--outputs`` names;
- a rerank row's query and document (its chunks) prepared as /v1/rerank prepares them, its
  relevance their MaxSim, sparse dot product or hybrid score (``colbert+sparse+dense``).

``Retrieval`` (made in the driver, from the model's configs and tokenizer) is what the
engine stages read answers with: they hold token ids and answers only, no tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from app.kinds.hybrid import hybrid_parts, lexical_vectors
from app.kinds.late_interaction import pooling_work
from app.kinds.sparse import sparse_work
from app.retrieval_inputs import maxsim, scored_tokens, skiplist_ids, sparse_dots, special_ids
from app.retrieval_scores import hybrid_scores
from replicas.answers import SparseVectors, TokenVectors
from replicas.contract import EmbedWork, PoolingHead
from replicas.embed_contract import LateInteraction
from replicas.settings import ReplicaSettings

# A hybrid model's parts (``--outputs``) and each one's result columns (docs/batch.md)
PARTS = {
    "dense": ("embedding",),
    "tokens": ("token_embeddings",),
    "sparse": ("sparse_indices", "sparse_values"),
}
# Each output's result columns
COLUMNS = {
    "tokens": ("embedding",),
    "sparse": PARTS["sparse"],
    "hybrid": tuple(column for columns in PARTS.values() for column in columns),
}


@dataclass(frozen=True)
class Retrieval:
    """How a late-interaction, sparse or hybrid model's answers are read: its output
    (``tokens``, ``sparse`` or ``hybrid``), its vectors' dimension (a sparse model's: its
    vocabulary; a hybrid model's: its dense vector's), its late-interaction settings and the
    skiplist's token ids; a hybrid model's head and the special tokens its lexical weights
    leave out (``app.retrieval_inputs.special_ids``)."""

    output: str
    dimension: int
    late: LateInteraction | None = None
    skip: frozenset[int] = frozenset()
    head: PoolingHead | None = None
    specials: frozenset[int] = frozenset()

    @property
    def columns(self) -> tuple[str, ...]:
        return COLUMNS[self.output]

    def columns_of(self, parts: Sequence[str]) -> tuple[str, ...]:
        """The result columns of a hybrid model's ``parts`` (in ``PARTS``' order); any other
        model's own."""
        if self.output != "hybrid":
            return self.columns
        return tuple(column for part in PARTS if part in parts for column in PARTS[part])


def retrieval_of(settings: ReplicaSettings) -> Retrieval | None:
    """The configured model's ``Retrieval`` (from its configs and tokenizer, no weights
    read); None when it does not embed, or embeds dense vectors."""
    from replicas.checkpoints.sources import load_hf_config, load_tokenizer, resolve_model_source
    from replicas.model.pooling_config import served_pooling_head

    source = resolve_model_source(settings.model.name)
    directory = None if source.is_gguf else source.directory
    head = served_pooling_head(directory, load_hf_config(source), settings.model)
    if head is None or head.output == "vector":
        return None
    if head.output == "hybrid":
        specials = special_ids(load_tokenizer(source))
        return Retrieval(head.output, head.dimension, head=head, specials=specials)
    skip = skiplist_ids(load_tokenizer(source), head.late) if head.late else frozenset()
    return Retrieval(head.output, head.dimension, head.late, skip)


def text_work(
    service: Any, text: str, role: str, prompt_name: str | None, truncate: bool
) -> EmbedWork:
    """One text's EmbedWork as /pooling (late interaction: cut to its role's length) or
    /embed_sparse (sparse, hybrid: ``prompt_name`` and ``truncate`` as its fields) prepares
    it; raises the route's ScoringError."""
    info, tokenizer = service.info, service.tokenizer
    if info.model_kind.output == "tokens":
        return pooling_work(info, tokenizer, {"input": text, "input_type": role})[1]
    body: dict[str, Any] = {"inputs": text, "input_type": role, "truncate": truncate}
    if prompt_name is not None:
        body["prompt_name"] = prompt_name
    return sparse_work(info, tokenizer, body)[1]


def input_vectors(work: EmbedWork, answer: Any, retrieval: Retrieval, role: str) -> list[Any]:
    """Each input's answer as the route writes it: its scored token vectors ``[tokens, D]``
    (late interaction), its ``(indices, values)`` (sparse), or its ``(dense [D],
    multi-vector [tokens - 1, C], (indices, values))`` (hybrid: /v1/embeddings', /pooling's
    and /embed_sparse's values)."""
    if retrieval.output == "sparse":
        return list(SparseVectors.checked(answer, work.num_items, retrieval.dimension))
    if retrieval.output == "hybrid":
        assert retrieval.head is not None
        parts = hybrid_parts(retrieval.head, work, answer)
        lexical = lexical_vectors(work, parts, retrieval.specials)
        return [(p[0], p[1], weights) for p, weights in zip(parts, lexical, strict=True)]
    lengths = [len(ids) for ids in work.inputs]
    vectors = TokenVectors.checked(answer, lengths, retrieval.dimension)
    late = retrieval.late
    assert late is not None
    return [
        scored_tokens(v, ids, role, late, retrieval.skip)
        for v, ids in zip(vectors, work.inputs, strict=True)
    ]


def row_columns(
    values: Sequence[Any], retrieval: Retrieval, parts: Sequence[str] = tuple(PARTS)
) -> dict[str, pa.Array]:
    """Each row's answer (None: a refused row, null) as its output's columns: ``embedding``
    list<fixed_size_list<float32, D>>, or ``sparse_indices`` list<int32> and
    ``sparse_values`` list<float32>; a hybrid model's ``parts``: ``embedding``
    fixed_size_list<float32, D>, ``token_embeddings`` list<fixed_size_list<float32, C>>
    and the sparse columns."""
    mask = pa.array([v is None for v in values], pa.bool_())
    if retrieval.output == "tokens":
        return {"embedding": _token_lists(values, retrieval.dimension, mask)}
    if retrieval.output == "sparse":
        return _sparse_columns(values, mask)
    columns: dict[str, pa.Array] = {}
    if "dense" in parts:
        columns["embedding"] = _vectors([_part(v, 0) for v in values], retrieval.dimension, mask)
    if "tokens" in parts:
        assert retrieval.head is not None and retrieval.head.hybrid is not None
        width = retrieval.head.hybrid.colbert_dimension
        columns["token_embeddings"] = _token_lists([_part(v, 1) for v in values], width, mask)
    if "sparse" in parts:
        columns |= _sparse_columns([_part(v, 2) for v in values], mask)
    return columns


def _part(value: Any, index: int) -> Any:
    return None if value is None else value[index]


def _vectors(values: Sequence[Any], width: int, mask: pa.Array) -> pa.Array:
    """One vector per row: fixed_size_list<float32, width> (zeros under a null row)."""
    flat = np.zeros((len(values), width), np.float32)
    for row, value in enumerate(values):
        if value is not None:
            flat[row] = value
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width, mask=mask)


def _token_lists(values: Sequence[Any], width: int, mask: pa.Array) -> pa.Array:
    """Vectors per row: list<fixed_size_list<float32, width>>."""
    parts = [np.asarray(v, np.float32).reshape(-1, width) for v in values if v is not None]
    flat = np.concatenate(parts) if parts else np.zeros((0, width), np.float32)
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width)
    counts = [len(v) if v is not None else 0 for v in values]
    return _lists(counts, tokens, mask)


def _sparse_columns(values: Sequence[Any], mask: pa.Array) -> dict[str, pa.Array]:
    counts = [len(v[0]) if v is not None else 0 for v in values]
    indices = [np.asarray(v[0], np.int32) for v in values if v is not None]
    weights = [np.asarray(v[1], np.float32) for v in values if v is not None]
    return {
        "sparse_indices": _lists(counts, pa.array(_joined(indices, np.int32)), mask),
        "sparse_values": _lists(counts, pa.array(_joined(weights, np.float32)), mask),
    }


def _joined(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype)


def _lists(counts: list[int], values: pa.Array, mask: pa.Array) -> pa.Array:
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def similarities(work: EmbedWork, answer: Sequence[Any], retrieval: Retrieval) -> np.ndarray:
    """Each document input's similarity with the query (input 0), float64, as
    ``app.retrieval_scores.similarities`` reads the replica's answer: MaxSim of their scored
    token vectors, the dot product of their sparse vectors, or the hybrid score
    (``app.retrieval_scores.hybrid_scores``)."""
    if retrieval.output == "sparse":
        vectors = SparseVectors.checked(answer, work.num_items, retrieval.dimension)
        return sparse_dots(vectors[0], vectors[1:])
    if retrieval.output == "hybrid":
        assert retrieval.head is not None
        return hybrid_scores(retrieval.specials, work, answer, retrieval.head)
    late = retrieval.late
    assert late is not None
    vectors = TokenVectors.checked(answer, [len(ids) for ids in work.inputs], retrieval.dimension)
    query = scored_tokens(vectors[0], work.inputs[0], "query", late, retrieval.skip)
    documents = [
        scored_tokens(v, ids, "document", late, retrieval.skip)
        for v, ids in zip(vectors[1:], work.inputs[1:], strict=True)
    ]
    return maxsim(query, documents, late)
