"""LoRA on a late-interaction model (issue 82): a peft adapter on a ColBERT's BERT backbone
gives ``MultiVectorEncoder``'s token vectors with the same adapter loaded (``load_adapter``)
within 1e-5 when the request's ``model`` names it, and the base's when it does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.embed_helpers import embed_settings
from tests.support.encoder_helpers import sentences
from tests.support.http_support import ask, engine_api
from tests.support.lora_helpers import save_embedding_adapter
from tests.support.retrieval_helpers import save_colbert

TOL = 1e-5


def settings_of(directory: Path, **changes: Any) -> Any:
    return embed_settings(
        directory, token_buckets=(128,), item_token_buckets=(64, 128), item_tokens_per_step=128,
        background_compile=False, **changes,
    )  # fmt: skip


def post(api: Any, path: str, body: Any) -> Any:
    reply = ask(api, "POST", path, json.dumps(body).encode())
    assert reply.status == 200, reply.body
    return reply.body


def token_vectors(api: Any, texts: list[str], model: str | None = None) -> list[np.ndarray]:
    body = {"input": texts, "input_type": "document", **({"model": model} if model else {})}
    return [np.asarray(row["data"], np.float32) for row in post(api, "/pooling", body)["data"]]


def test_a_colbert_adapter_embeds_as_multi_vector_encoder_with_peft(tmp_path: Path) -> None:
    from sentence_transformers import MultiVectorEncoder

    directory = save_colbert(tmp_path / "colbert", seed=4)
    adapter = save_embedding_adapter(
        tmp_path / "colbert-hf", tmp_path / "tuned", seed=9, r=4, lora_alpha=8,
        target_modules=["query", "key", "value", "dense"],
    )  # fmt: skip
    lora = {"lora_adapters": (("tuned", str(adapter)),), "max_loras": 1, "max_lora_rank": 4}
    api, _ = engine_api(settings_of(directory, **lora), warm=False)
    texts = sentences(6, 6, longest=40)
    model = MultiVectorEncoder(str(directory), device="cpu")
    base = model.encode_document(texts, convert_to_numpy=True)
    model.load_adapter(str(adapter))
    want = model.encode_document(texts, convert_to_numpy=True)
    assert max(np.abs(w - b).max() for w, b in zip(want, base, strict=True)) > 1e-3
    for got, expected in zip(token_vectors(api, texts, "tuned"), want, strict=True):
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
    for got, expected in zip(token_vectors(api, texts), base, strict=True):
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
