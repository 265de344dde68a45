"""LoRA adapters on BERT, XLM-RoBERTa and ModernBERT encoders (issue 62, semantics 21): an
embedder's vectors with a peft adapter equal sentence-transformers' ``encode`` with the same
adapter loaded (``SentenceTransformer.load_adapter``), one step mixing the adapter and the base
each as alone; a cross-encoder's outputs with an adapter on its layers equal transformers with
peft's ``PeftModel``, and ``/v1/rerank`` naming the adapter answers their sigmoid; LoRA on a
cross-encoder's pooler (ModernBERT: its prediction head) is refused, naming the tensor.

The adapters are peft's, on every projection of the layers (rank 4), their weights random:
BERT's query, key, value and three dense layers (on a bare model ``dense`` wraps the pooler
too, which an embedder never reads: its LoRA tensors are skipped); ModernBERT's fused ``Wqkv``
and ``Wi`` (split into q, k, v and the GeGLU's input and gate) and both ``Wo``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.service import ScoringService
from replicas.checkpoints.adapters import AdapterError, load_adapter
from replicas.checkpoints.sources import load_tokenizer, resolve_model_source
from replicas.contract import EmbedWork
from replicas.engine.scoring_engine import ScoringEngine
from tests.support.embed_helpers import embed_settings, reference_vectors
from tests.support.encoder_helpers import save_bert_cross_encoder, save_bert_embedder, sentences
from tests.support.fp32 import assert_fp32_close
from tests.support.lora_helpers import save_embedding_adapter

TOL = 1e-5
TARGETS = {
    "bert": ["query", "key", "value", "dense"],
    "xlm_roberta": ["query", "key", "value", "dense"],
    "modernbert": ["Wqkv", "Wo", "Wi"],
}


def settings(directory: Path, adapter: Path | None, **changes: Any) -> Any:
    lora = {} if adapter is None else {"lora_adapters": (("tuned", str(adapter)),)}
    return embed_settings(
        directory, token_buckets=(128,), item_token_buckets=(64, 128), item_tokens_per_step=128,
        max_loras=1, max_lora_rank=4, background_compile=False, **lora, **changes,
    )  # fmt: skip


@pytest.fixture(scope="module", params=["bert", "xlm_roberta", "modernbert"])
def tuned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny embedder of the family (mean pooling) with one adapter, ``tuned``."""
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    directory = save_bert_embedder(root / "mean", "mean", family=request.param)
    adapter = save_embedding_adapter(
        root / "mean-hf",
        root / "tuned",
        seed=7,
        r=4,
        lora_alpha=8,
        target_modules=TARGETS[request.param],
    )
    engine = ScoringEngine.from_settings(settings(directory, adapter), warm=False)
    return {"directory": directory, "adapter": adapter, "engine": engine}


def st_vectors(directory: Path, adapter: Path | None, texts: list[str]) -> np.ndarray:
    """sentence-transformers' ``encode``, with the adapter loaded through peft."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(directory), device="cpu", local_files_only=True)
    if adapter is not None:
        model.load_adapter(str(adapter))
    return np.asarray(model.encode(texts, convert_to_numpy=True), np.float32)


def test_an_encoder_adapter_embeds_as_sentence_transformers_with_peft(tuned: dict) -> None:
    engine: ScoringEngine = tuned["engine"]
    texts = sentences(3, 6, longest=12)  # both works' inputs fit one step
    tokenizer = load_tokenizer(resolve_model_source(tuned["directory"]))
    inputs = tuple(tuple(tokenizer(text)["input_ids"]) for text in texts)
    want = st_vectors(tuned["directory"], tuned["adapter"], texts)
    base = reference_vectors(tuned["directory"], texts)
    assert np.abs(want - base).max() > 1e-3  # the adapter changes every vector
    works = [EmbedWork(inputs, adapter="tuned"), EmbedWork(inputs)]
    alone = [engine.score_batch([work])[0] for work in works]
    np.testing.assert_allclose(alone[0], want, atol=TOL, rtol=0)
    np.testing.assert_allclose(alone[1], base, atol=TOL, rtol=0)
    steps = engine.stats().steps
    mixed = engine.score_batch(works)
    assert engine.stats().steps == steps + 1  # one step holds both adapters' inputs
    for got, expected in zip(mixed, alone, strict=True):
        np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_cross_encoder_adapter_scores_as_peft(tmp_path: Path, family: str) -> None:
    """An adapter on a ``BertForSequenceClassification``'s (``ModernBertFor...``'s) layers,
    its classifier the base's: each pair's logit equals transformers' with ``PeftModel``."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from tests.support.lora_helpers import randomize_lora_

    pooling = "mean" if family == "modernbert" else "cls"
    directory = save_bert_cross_encoder(tmp_path / "ce", family=family, pooling=pooling)
    torch.manual_seed(8)
    base = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "ce-hf"))
    layers = r".*encoder\.layer\.\d+\..*(query|key|value|dense)"  # not the pooler's dense
    layers = TARGETS["modernbert"] if family == "modernbert" else layers  # not head.dense
    tuned = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=layers))
    randomize_lora_(tuned, 8)
    adapter = tmp_path / "tuned"
    tuned.save_pretrained(str(adapter), safe_serialization=True)
    engine = ScoringEngine.from_settings(settings(directory, adapter), warm=False)
    tokenizer = load_tokenizer(resolve_model_source(directory))
    pairs = [("river stone", text) for text in sentences(4, 5, longest=30)]
    encoded = tokenizer([q for q, _ in pairs], [d for _, d in pairs], padding=True)
    base = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "ce-hf"))
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    with torch.no_grad():
        tensors = {key: torch.tensor(value) for key, value in encoded.items()}
        want = model(**tensors).logits.numpy()[:, 0]
    inputs, seconds = [], []
    for row, ids in enumerate(encoded["input_ids"]):
        inputs.append(tuple(t for t in ids if t != tokenizer.pad_token_id))
        if "token_type_ids" in encoded:
            seconds.append(encoded["token_type_ids"][row].index(1))
    work = EmbedWork(tuple(inputs), adapter="tuned", second_starts=tuple(seconds))
    got, base_got = engine.score_batch([work, dataclasses.replace(work, adapter=None)])
    # logits past 1 in size: the float32 floor's relative term counts (1.04e-5 at 1.23 seen)
    layers = 3 if family == "modernbert" else 2  # tests/support/encoder_helpers.py's configs
    assert_fp32_close(np.asarray(got)[:, 0], want, layers, "adapter logits vs peft")
    assert np.abs(np.asarray(base_got)[:, 0] - want).min() > 1e-3  # the adapter changes each
    service = ScoringService.from_settings(settings(directory, adapter))

    async def backend(routed: Any) -> Any:
        return engine.score_batch([routed])[0]

    body = {"query": "river stone", "documents": [d for _, d in pairs], "model": "tuned"}
    answer = asyncio.run(service.rerank_timed(body, backend))[0]
    relevance = [r["relevance_score"] for r in sorted(answer["results"], key=lambda r: r["index"])]
    sigmoid = 1 / (1 + np.exp(-want))  # CrossEncoder's activation for one label
    np.testing.assert_allclose(relevance, sigmoid, atol=TOL, rtol=0)
    # ``dense`` alone also wraps the pooler (head) the classifier reads: refused, naming it.
    pooled = get_peft_model(
        AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "ce-hf")),
        LoraConfig(r=4, lora_alpha=8, target_modules=["dense"]),
    )
    pooled.save_pretrained(str(tmp_path / "pooled"), safe_serialization=True)
    pooler = "head" if family == "modernbert" else "pooler"
    with pytest.raises(AdapterError, match=rf"{pooler}\.dense\.lora_A\.weight: LoRA on a cross"):
        load_adapter("pooled", str(tmp_path / "pooled"), engine.model.config, max_rank=4)
