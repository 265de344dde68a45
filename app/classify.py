"""/v1/classify (semantics 18) on a score-head model, in vLLM's and SGLang's shape, and what
/v1/models says about the head.

Each input is one row: its tokens (encoded with the tokenizer's special tokens) as a query
with one empty item, so the head reads the row's last token, exactly where transformers reads
a sequence classifier. The inputs of one request go to the replica together and are packed
into its steps like any rows. The activation runs here with SciPy (``app.scores``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from app.schema import ClassifyRequest
from app.scores import classify_probs
from app.tokenization import TextTokenizer
from app.validation import (
    check_item_count,
    check_model_name,
    check_unicode,
    check_work,
    validate_body,
)
from replicas.contract import ModelInfo, ScoreHead, ScoreWork
from replicas.errors import Reason, ScoringError


@dataclass(frozen=True)
class ClassifyWork:
    """A validated /v1/classify request and one ScoreWork per input."""

    request: ClassifyRequest
    works: tuple[ScoreWork, ...]
    prompt_tokens: int


def head_of(info: ModelInfo) -> ScoreHead:
    """The served head (only the score-head kind classifies here, app.kinds)."""
    return cast(ScoreHead, info.head)


def prepare_classify(payload: Any, info: ModelInfo, tokenizer: TextTokenizer) -> ClassifyWork:
    request = validate_body(payload, ClassifyRequest)
    adapter = check_model_name(request.model, info)
    head = head_of(info)
    texts = [request.input] if isinstance(request.input, str) else list(request.input)
    check_item_count(len(texts), info)
    if any(not isinstance(text, str) for text in texts):
        raise ScoringError(
            Reason.INVALID_REQUEST,
            f"/v1/classify: a pair [text, text_pair] is scored by a cross_encoder model; "
            f"model {info.name!r} is a {info.kind} (send single texts)",
            "input",
        )
    for text in texts:
        check_unicode(text, "input")
    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
    works = tuple(
        ScoreWork(tuple(int(t) for t in ids), ((),), head.label_ids, adapter=adapter)
        for ids in encoded
    )
    for work in works:
        try:
            check_work(work, info)
        except ScoringError as error:
            raise ScoringError(error.reason, error.message, "input") from None
    return ClassifyWork(request, works, sum(len(work.query_ids) for work in works))


def classify_body(
    prepared: ClassifyWork, outputs: np.ndarray | None, info: ModelInfo, created: int
) -> dict[str, Any]:
    """``{id, object: "list", created, model, data: [{index, label, probs, num_classes}],
    usage}``; ``outputs``: the head's logits ``[inputs, num_labels]`` (None: no inputs)."""
    values = outputs
    if outputs is not None and prepared.request.activation:
        values = classify_probs(outputs, head_of(info).problem_type)
    return classify_envelope(prepared.request, values, prepared.prompt_tokens, info, created)


def classify_envelope(
    request: ClassifyRequest, values: np.ndarray | None, tokens: int, info: ModelInfo, created: int
) -> dict[str, Any]:
    """The /v1/classify body of ``values`` ``[inputs, num_labels]``, activated or not (None:
    no inputs): each row's label is its largest value's."""
    head = head_of(info)
    data = []
    if values is not None:
        for index, row in enumerate(np.asarray(values, np.float64)):
            data.append(
                {
                    "index": index,
                    "label": head.id2label[int(np.argmax(row))],
                    "probs": row.tolist(),
                    "num_classes": head.num_labels,
                }
            )
    return {
        "id": f"classify-{uuid.uuid4().hex}",
        "object": "list",
        "created": created,
        "model": request.model or info.name,  # an adapter's name when it named one
        "data": data,
        "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
    }


def head_card(head: ScoreHead | None) -> dict[str, Any]:
    """/v1/models' fields about how the model scores."""
    if head is None:
        return {"scoring": "label_tokens", "num_labels": None, "id2label": None}
    labels = {str(i): name for i, name in enumerate(head.id2label)}
    return {"scoring": "head", "num_labels": head.num_labels, "id2label": labels}
