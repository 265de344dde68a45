"""Embedding inputs prepared as sentence-transformers 6.2 prepares them (semantics 20).

Token ids: ``Embedder.text_work`` (what /v1/embeddings, /v2/embed, cosine /v1/score and
/v1/rerank and ``python -m batch embed`` share) equals the Transformer module's
``preprocess`` on directories saved with SmolLM2's chat template (``modality_config`` with
``message``: rendered through the template, the prompt as a system message, the template's
tail restored on a cut input) and without (plain text, the prompt in front, its tokens left
out of mean pooling with ``include_prompt: false``), on a structured-content template, a
bare directory (inferred) and a directory saved without ``modality_config`` (text only), with
and without prompts, short and past ``max_seq_length``. Vectors: the chat directories' on the
session's engines of the same weights equal ``encode`` within 1e-5. What scorejax cannot
reproduce fails at start-up, naming it.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.embeddings import Embedder
from app.service import ScoringService
from replicas.model.pooling_config import UnsupportedEmbeddingError
from tests.support.embed_helpers import QUERY_PROMPT, embed_settings, reference_vectors, texts_of

TOL = 1e-5
PROMPTS = {None: None, "query": QUERY_PROMPT, "document": ""}
STRUCTURED = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message.content[0].text }}<|im_end|>\n{% endfor %}"
)


@functools.lru_cache(maxsize=16)
def st_module(directory: str) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(directory, device="cpu", local_files_only=True)[0]


def st_inputs(directory: Path, texts: list[str], prompt: str | None) -> tuple[list, Any]:
    """The Transformer module's ids per input (padding dropped) and its prompt_length."""
    features = st_module(str(directory)).preprocess(texts, prompt=prompt)
    ids, mask = features["input_ids"].tolist(), features["attention_mask"].tolist()
    rows = [
        tuple(i for i, m in zip(row, keep, strict=True) if m)
        for row, keep in zip(ids, mask, strict=True)
    ]
    return rows, features.get("prompt_length")


def embedder_of(directory: Path, **changes: Any) -> Embedder:
    return ScoringService.from_settings(embed_settings(directory, **changes)).embedder


def copy_config(directory: Path, target: Path) -> Path:
    """The directory without its weights (enough for its PoolingHead and tokenizer)."""
    shutil.copytree(directory, target, ignore=shutil.ignore_patterns("*.safetensors"))
    return target


def edit_json(path: Path, change: Any) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


@pytest.fixture(scope="module")
def variants(embedding_dirs: dict, chat_embedding_dirs: dict, tmp_path_factory) -> dict:
    """Directory by name: text, chat, structured chat, bare (inferred), no modality_config."""
    root = tmp_path_factory.mktemp("inputs")
    chat = chat_embedding_dirs["qwen3-last"]
    structured = shutil.copytree(chat, root / "structured")
    (structured / "chat_template.jinja").write_text(STRUCTURED)
    edit_json(
        structured / "sentence_bert_config.json",
        lambda c: c["modality_config"]["message"].update(format="auto"),
    )
    legacy = shutil.copytree(chat, root / "legacy")
    edit_json(legacy / "sentence_bert_config.json", lambda c: c.pop("modality_config"))
    bare = chat.parent / f"{chat.name}-hf"
    return {
        "text-last": embedding_dirs["qwen3-last"],
        "text-mean": embedding_dirs["llama-mean"],
        "chat-last": chat,
        "chat-mean": chat_embedding_dirs["llama-mean"],
        "structured": structured,
        "legacy": legacy,
        "bare": bare,
    }


FORMATS = {
    "text-last": "text",
    "text-mean": "text",
    "chat-last": "chat_template",
    "chat-mean": "chat_template",
    "structured": "chat_template",
    "legacy": "text",
    "bare": "chat_template",
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_token_ids_equal_sentence_transformers_preprocess(variants: dict, name: str) -> None:
    directory = variants[name]
    changes = {"pooling": "mean"} if name == "bare" else {}
    embedder = embedder_of(directory, **changes)
    head = embedder.info.pooling
    assert head.inputs.kind == FORMATS[name]
    if name == "structured":
        assert head.inputs.message_format == "structured"
    limit = head.max_seq_length or 1024
    short = texts_of(21, 4, longest=40)
    long = [" ".join(["river stone"] * limit), " ".join(["blue"] * (limit - 12))]
    cases = [(short, None)] if name == "bare" else [(short, None), (long, limit)]
    for prompt_name, prompt in PROMPTS.items():
        if prompt_name is not None and name == "bare":
            continue
        for texts, keep in cases:
            expected, prompt_length = st_inputs(directory, texts, prompt)
            work = embedder.text_work(texts, prompt, keep)
            assert [list(ids) for ids in work.inputs] == [list(ids) for ids in expected]
            skips = list(work.prompt_lengths) or [0] * len(texts)
            excluded = prompt_length if prompt and not head.include_prompt else None
            assert skips == [excluded or 0] * len(texts), (prompt_name, prompt_length)
    if (
        head.inputs.chat and name != "bare"
    ):  # the tail is back on a cut input: SmolLM2's "<|im_end|>\n"
        cut = embedder.text_work(long[:1], None, limit).inputs[0]
        assert len(cut) == limit and cut[-2:] == (2, 198)


def test_chat_template_vectors_equal_sentence_transformers(
    embedding_dirs: dict, chat_embedding_dirs: dict, embedding_engine: Any
) -> None:
    """On the no-template directory's engine (the same weights): last token (Qwen3) and mean
    (Llama, ``include_prompt: false``, which a rendered chat does not apply), with the
    ``query`` prompt and none, short and cut at ``max_seq_length``. Plain text, as scorejax
    embedded these before, is far from ``encode``."""
    texts = [*texts_of(22, 6, longest=50), " ".join(["seven cloud"] * 80)]
    for variant, chat in chat_embedding_dirs.items():
        plain = embedding_dirs[variant]
        assert (chat / "model.safetensors").read_bytes() == (
            plain / "model.safetensors"
        ).read_bytes()
        engine, embedder = embedding_engine(variant), embedder_of(chat)
        for prompt_name in (None, "query"):
            reference = reference_vectors(chat, texts, prompt_name=prompt_name)
            work = embedder.text_work(texts, PROMPTS[prompt_name], 64)
            (vectors,) = engine.score_batch([work])
            np.testing.assert_allclose(vectors, reference, atol=TOL, rtol=0)
            as_text = embedder_of(plain).text_work(texts, PROMPTS[prompt_name], 64)
            (before,) = engine.score_batch([as_text])
            assert np.abs(before - reference).max() > 0.05


def unsupported(
    directory: Path, target: Path, change: Any, name: str = "sentence_bert_config.json"
) -> str:
    edit_json(copy_config(directory, target) / name, change)
    with pytest.raises(UnsupportedEmbeddingError) as error:
        ScoringService.from_settings(embed_settings(target))
    return str(error.value)


def test_what_scorejax_cannot_reproduce_fails_at_start_up(
    chat_embedding_dirs: dict, tmp_path: Path
) -> None:
    chat = chat_embedding_dirs["qwen3-last"]

    def modality(name: str, entry: Any) -> Any:
        return lambda c: c["modality_config"].update({name: entry})

    image = {"method": "get_image_features", "method_output_name": "pooler_output"}
    assert "'image' is not supported" in unsupported(chat, tmp_path / "a", modality("image", image))
    other = {"method": "forward", "method_output_name": "pooler_output"}
    assert "'text' reads" in unsupported(chat, tmp_path / "b", modality("text", other))
    kwargs = {"text": {"max_length": 8}}
    message = unsupported(chat, tmp_path / "c", lambda c: c.update(processing_kwargs=kwargs))
    assert "processing_kwargs: ['text']" in message
    weird = modality("message", {**other, "method_output_name": "last_hidden_state", "format": "x"})
    assert "message format 'x'" in unsupported(chat, tmp_path / "d", weird)
    no_template = copy_config(chat, tmp_path / "e")
    (no_template / "chat_template.jinja").unlink()
    with pytest.raises(UnsupportedEmbeddingError, match="has no chat template"):
        ScoringService.from_settings(embed_settings(no_template))
    lower = unsupported(chat, tmp_path / "f", lambda c: c.update(do_lower_case=True))
    assert "do_lower_case" in lower


def test_batch_embed_prepares_rows_the_same_way(
    chat_embedding_dirs: dict, embedding_engine
) -> None:
    """``python -m batch embed``'s stages on the chat directory equal ``encode``."""
    import pyarrow as pa

    from batch.embed_stage import EmbedColumns, EmbedEngine, EmbedPrepare, finish_embed

    directory = chat_embedding_dirs["qwen3-last"]
    texts = texts_of(23, 5, longest=40)
    service = ScoringService.from_settings(embed_settings(directory))
    prepare = EmbedPrepare.around(service, EmbedColumns(prompt_name="query"))
    rows = pa.Table.from_pylist([{"id": n, "text": text} for n, text in enumerate(texts)])
    table = finish_embed(EmbedEngine.around(embedding_engine("qwen3-last"))(prepare(rows)), None)
    reference = reference_vectors(directory, texts, prompt_name="query")
    np.testing.assert_allclose(table.column("embedding").to_pylist(), reference, atol=TOL, rtol=0)
