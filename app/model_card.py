"""``/v1/models``: the served model's card (app.schema.ModelCard), then one per LoRA adapter
(the base's card under the adapter's name with the base as its ``parent``, vLLM's shape)."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.chunks import ChunkOptions
from app.classify import head_card
from app.embeddings import input_limit
from app.kinds import answers_of
from replicas.contract import ModelInfo, PoolingHead


def models_body(
    info: ModelInfo, rerank_method: str | None, chunking: ChunkOptions, created: int
) -> dict[str, Any]:
    """The list body; ``rerank_method``: the decoder reranker's (None: none)."""
    base = base_card(info, rerank_method, chunking, created)
    adapters = [{**base, "id": name, "parent": base["id"]} for name in info.adapters]
    return {"object": "list", "data": [base, *adapters]}


def base_card(
    info: ModelInfo, rerank_method: str | None, chunking: ChunkOptions, created: int
) -> dict[str, Any]:
    """The base model's card; app.schema.ModelCard describes its fields."""
    pooling, kind = info.pooling, answers_of(info)
    reranks = rerank_method is not None or info.model_kind.embeds  # a similarity, or pairs
    return {
        "id": info.name,
        "object": "model",
        "created": created,
        "owned_by": "scorejax",
        "vocab_size": info.vocab_size,
        "multi_item_scoring_delimiter": info.multi_item_scoring_delimiter,
        "max_items_per_request": info.limits.max_items_per_request,
        "max_multi_item_seq_len": info.limits.max_multi_item_seq_len,
        "warm_envelopes": [dataclasses.asdict(e) for e in info.limits.envelopes],
        "rerank_method": rerank_method,
        **head_card(info.head),
        **({"rerank_method": kind.similarity, "scoring": kind.similarity} if pooling else {}),
        "kind": info.kind,
        "outputs": list(kind.outputs),
        "pooling": pooling.pooling if pooling else None,
        "dimension": pooling.dimension if pooling else None,
        "input_format": pooling.inputs.kind if pooling else None,
        "max_input_tokens": input_limit(info) if pooling else None,
        **matryoshka_card(pooling),
        "rerank_chunking": chunking_card(chunking) if reranks else None,
    }


def matryoshka_card(pooling: PoolingHead | None) -> dict[str, Any]:
    """``is_matryoshka`` (vLLM's word: the vector may be cut) and ``matryoshka_dimensions``
    (the sizes it may be cut to, its whole dimension among them; null: any size, or none
    when not Matryoshka); both null for a model that embeds nothing."""
    if pooling is None:
        return {"is_matryoshka": None, "matryoshka_dimensions": None}
    cuts = pooling.matryoshka
    sizes = sorted({*cuts, pooling.dimension}) if cuts else None
    return {"is_matryoshka": cuts is not None, "matryoshka_dimensions": sizes}


def chunking_card(options: ChunkOptions) -> dict[str, Any]:
    return {
        "max_chunks_per_doc": options.max_chunks,
        "chunk_tokens": options.chunk_tokens,
        "chunk_overlap": options.overlap,
        "chunk_aggregation": options.aggregation,
    }
