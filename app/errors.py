"""The OpenAI/SGLang error envelope and the machine-readable reasons the ingress answers with.

Every rejected request gets the same body shape, over HTTP and through a DeploymentHandle:
``{"object": "error", "message", "type", "param", "code", "reason"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """Why a request was rejected; the ``reason`` field of the error envelope."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    EMPTY_LABEL_TOKEN_IDS = "empty_label_token_ids"
    LABELS_WITH_HEAD = "label_token_ids_with_head"  # label ids given to a score-head model
    NO_SCORE_HEAD = "no_score_head"  # /v1/classify on a causal LM
    NO_LM_HEAD = "no_lm_head"  # token log-probs asked of a score-head model
    NEGATIVE_TOKEN_ID = "negative_token_id"
    TOKEN_ID_EXCEEDS_VOCAB = "token_id_exceeds_vocab"
    MIXED_INPUT_TYPES = "mixed_input_types"
    EMPTY_QUERY = "empty_query"
    TOO_MANY_ITEMS = "too_many_items"
    SEQUENCE_TOO_LONG = "sequence_too_long"
    TOO_MANY_LABELS = "too_many_labels"
    TOO_MANY_TOKENS = "too_many_tokens"
    DELIMITER_IN_CONTENT = "delimiter_in_content"
    EMPTY_PROMPT = "empty_prompt"
    EMPTY_INPUT = "empty_input"  # an empty embedding input (text, token list or list)
    INVALID_DIMENSIONS = "invalid_dimensions"  # Matryoshka dimensions outside 1..dimension
    UNKNOWN_PROMPT = "unknown_prompt"  # a prompt_name / input_type the model has no prompt for
    UNSUPPORTED_FOR_MODEL = "unsupported_for_model"  # a route the model's kind cannot serve
    GENERATION_NOT_SUPPORTED = "generation_not_supported"
    MODEL_NOT_FOUND = "model_not_found"  # 404: neither the base model nor a LoRA adapter
    NOT_FOUND = "not_found"
    UNAUTHORIZED = "unauthorized"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal_error"


_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ScoreRequestError(ValueError):
    """A request the ingress answers with an error envelope instead of scores.

    Picklable (``__reduce__``), so a DeploymentHandle caller can catch it by type and read
    ``body``, the exact JSON the HTTP route sends.
    """

    def __init__(
        self,
        reason: Reason | str,
        message: str,
        param: str | None = None,
        status_code: int = 400,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = Reason(reason)
        self.message = message
        self.param = param
        self.status_code = status_code
        self.retry_after_s = retry_after_s  # the Retry-After header of a 503, if any

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.reason.value, self.message, self.param, self.status_code)
        return (type(self), (*fields, self.retry_after_s))

    @property
    def headers(self) -> dict[str, str]:
        headers = {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}
        if self.status_code == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers

    @property
    def body(self) -> dict[str, Any]:
        return error_body(self.reason, self.message, self.param, self.status_code)


def error_body(
    reason: Reason | str, message: str, param: str | None = None, status_code: int = 400
) -> dict[str, Any]:
    """The envelope SGLang/OpenAI clients parse, plus our ``reason``."""
    return {
        "object": "error",
        "message": message,
        "type": _TYPES.get(status_code, "BadRequestError"),
        "param": param,
        "code": status_code,
        "reason": str(Reason(reason)),
    }


# The admission verdict: raises ScoreRequestError (503 overloaded) to refuse a request. It
# runs after the body's schema checks and before tokenization (a refusal costs no more).
Gate = Callable[[], None]


def admit_all() -> None:
    """The gate of a service without admission control."""
