"""Every rejection rule of semantics 7 (docs/semantics.md), as functions raising ScoringError.

The limit rules (too_many_items, sequence_too_long) come from replicas.contract.check_limits,
the same function the engine runs, so the ingress and the replicas share one definition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from app.schema import ScoreRequest
from replicas.contract import ModelInfo, ScoreHead, ScoreWork, check_limits
from replicas.errors import Reason, ScoringError

Body = TypeVar("Body", bound=BaseModel)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> Any:
    """Decode a request body; anything that is not strict JSON is ``invalid_json``."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:  # JSONDecodeError/UnicodeDecodeError: ValueError
        raise ScoringError(
            Reason.INVALID_JSON, f"request body is not valid JSON: {_short(error)}"
        ) from None


def validate_request(payload: Any) -> ScoreRequest:
    """Check a decoded body against the strict schema; errors become 400s, never 422s."""
    return validate_body(payload, ScoreRequest, _schema_error)


def validate_body(
    payload: Any,
    schema: type[Body],
    to_error: Callable[[ValidationError, Mapping[str, Any]], ScoringError] | None = None,
) -> Body:
    """A decoded body as ``schema`` (strict); its first problem is a 400 (``to_error``'s,
    else ``schema_error``'s)."""
    if not isinstance(payload, Mapping):
        raise ScoringError(
            Reason.INVALID_REQUEST,
            f"request body must be a JSON object, got {type(payload).__name__}",
        )
    try:
        return schema.model_validate(dict(payload), strict=True)
    except ValidationError as error:
        raise (to_error(error, payload) if to_error else schema_error(error)) from None
    except RecursionError:
        raise ScoringError(Reason.INVALID_REQUEST, "request is nested too deeply") from None


def _schema_error(error: ValidationError, payload: Mapping[str, Any]) -> ScoringError:
    if "label_token_ids" not in payload or payload.get("label_token_ids") is None:
        return ScoringError(
            Reason.EMPTY_LABEL_TOKEN_IDS,
            "label_token_ids is required and must list at least one token id",
            param="label_token_ids",
        )
    return schema_error(error)


def schema_error(error: ValidationError) -> ScoringError:
    """The 400 of a pydantic error: its first problem, where it is (``param``)."""
    details = error.errors(include_url=False, include_input=False)
    first = details[0]
    location = [str(part) for part in first.get("loc", ())]
    param = location[0] if location else None
    where = ".".join(location) or "request"
    return ScoringError(
        Reason.INVALID_REQUEST, f"{where}: {first.get('msg', 'invalid value')}", param=param
    )


def check_model_name(requested: str | None, info: ModelInfo) -> str | None:
    """The LoRA adapter a request's ``model`` names (semantics 21): None for no ``model`` or
    the base model's name; a name served neither way is a 404 ``model_not_found``."""
    if requested is None or requested == info.name:
        return None
    if requested in info.adapters:
        return requested
    served = ", ".join(repr(name) for name in (info.name, *info.adapters))
    raise ScoringError(
        Reason.MODEL_NOT_FOUND,
        f"model {requested!r} is not served here; this server serves {served}",
        param="model",
        status_code=404,
    )


def check_token_ids(ids: Iterable[int], vocab_size: int, param: str) -> None:
    """Negative ids and ids >= the model's vocabulary size are rejected."""
    for token_id in ids:
        if token_id < 0:
            raise ScoringError(
                Reason.NEGATIVE_TOKEN_ID, f"{param}: token id {token_id} is negative", param
            )
        if token_id >= vocab_size:
            raise ScoringError(
                Reason.TOKEN_ID_EXCEEDS_VOCAB,
                f"{param}: token id {_short(token_id)} is >= the vocabulary size {vocab_size}",
                param,
            )


def score_labels(labels: Sequence[int] | None, info: ModelInfo) -> tuple[int, ...]:
    """A ScoreWork's label ids: the request's (checked) for a causal LM; every output of a
    score-head model, which takes no label_token_ids (semantics 18)."""
    if info.model_kind.lm_head:
        if not labels:
            message = "label_token_ids must list at least one token id"
            raise ScoringError(Reason.EMPTY_LABEL_TOKEN_IDS, message, param="label_token_ids")
        check_token_ids(labels, info.vocab_size, "label_token_ids")
        return tuple(labels)
    head = cast(ScoreHead, info.head)
    if labels is not None:
        raise ScoringError(
            Reason.LABELS_WITH_HEAD,
            f"label_token_ids: model {info.name!r} scores with a head of {head.num_labels} "
            "label(s); omit label_token_ids (each row holds the head's outputs)",
            param="label_token_ids",
        )
    return head.label_ids


def is_text_request(request: ScoreRequest) -> bool:
    """True for text input, False for token input; a mix is ``mixed_input_types``."""
    text = isinstance(request.query, str)
    for item in request.items:
        if isinstance(item, str) != text:
            kind = "text" if text else "token ids"
            raise ScoringError(
                Reason.MIXED_INPUT_TYPES,
                f"query is {kind} but an item is not; query and items must all be text "
                "or all be token ids",
                param="items",
            )
    return text


def encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogates) a tokenizer can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_unicode(text: str, param: str) -> None:
    """Lone surrogates (legal in JSON escapes) cannot be tokenized: a 400 naming ``param``,
    never a crash."""
    if not encodable(text):
        raise ScoringError(Reason.INVALID_REQUEST, f"{param}: text is not valid Unicode", param)


def check_text_encodable(request: ScoreRequest) -> None:
    """Every text of a score request passes ``check_unicode``."""
    texts = [("query", request.query), *(("items", item) for item in request.items)]
    for param, text in texts:
        check_unicode(str(text), param)


def check_token_inputs(request: ScoreRequest, vocab_size: int) -> None:
    check_token_ids(request.query, vocab_size, "query")  # type: ignore[arg-type]
    for item in request.items:
        check_token_ids(item, vocab_size, "items")  # type: ignore[arg-type]


def check_item_count(num_items: int, info: ModelInfo) -> None:
    """Early form of the too_many_items rule, before any tokenization work."""
    limit = info.limits.max_items_per_request
    if num_items > limit:
        raise ScoringError(
            Reason.TOO_MANY_ITEMS,
            f"{num_items} items exceed max_items_per_request={limit}",
            param="items",
        )


def check_work(work: ScoreWork, info: ModelInfo) -> None:
    """Rules that need token ids: empty query, delimiter in content, the shared limits."""
    if not work.query_ids:
        raise ScoringError(Reason.EMPTY_QUERY, "query is empty after tokenization", param="query")
    delimiter = info.multi_item_scoring_delimiter
    if delimiter is not None:
        if delimiter in work.query_ids:
            raise _delimiter_error("query", delimiter)
        if any(delimiter in item for item in work.item_ids):
            raise _delimiter_error("items", delimiter)
    try:
        check_limits(work, info.limits, multi_item=delimiter is not None)
    except ScoringError as error:
        params = {Reason.TOO_MANY_ITEMS: "items", Reason.TOO_MANY_LABELS: "label_token_ids"}
        param = params.get(Reason(error.reason))
        raise ScoringError(error.reason, error.message, param=param) from None


def _delimiter_error(param: str, delimiter: int) -> ScoringError:
    return ScoringError(
        Reason.DELIMITER_IN_CONTENT,
        f"{param} contains token id {delimiter}, the multi-item scoring delimiter; "
        "it may not appear in the query or an item",
        param=param,
    )


def _short(value: object, limit: int = 120) -> str:
    try:
        text = str(value)
    except ValueError:  # ints beyond sys.get_int_max_str_digits()
        return "<a number too large to print>"
    return text if len(text) <= limit else text[:limit] + "..."
