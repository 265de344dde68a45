"""The one error a request is refused with, wherever it is refused, and its reasons.

Jax-free and at the bottom of ``replicas`` (beside ``contract``): the ingress (``app/``), the
limits both sides of the handle check (``contract``), the engine's own checks and the replica
all raise ``ScoringError``. It crosses a DeploymentHandle (picklable), and its ``body`` is the
OpenAI/SGLang error envelope every rejected request gets, over HTTP and through a handle:
``{"object": "error", "message", "type", "param", "code", "reason"}``.

``EngineUnavailable`` is not a refusal of a request: it is an engine telling its replica that
it is dead (a host of its group died or stalled). The replica answers the request with a
``ScoringError`` (503 ``unavailable``) and reports itself unhealthy.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """Why a request was rejected; the ``reason`` field of the error envelope."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # a POST body whose Content-Type is not JSON
    EMPTY_LABEL_TOKEN_IDS = "empty_label_token_ids"
    LABELS_WITH_HEAD = "label_token_ids_with_head"  # label ids given to a score-head model
    NO_SCORE_HEAD = "no_score_head"  # /v1/classify on a causal LM
    NO_LM_HEAD = "no_lm_head"  # token log-probs asked of a score-head model
    NEGATIVE_TOKEN_ID = "negative_token_id"
    TOKEN_ID_EXCEEDS_VOCAB = "token_id_exceeds_vocab"
    MIXED_INPUT_TYPES = "mixed_input_types"
    EMPTY_QUERY = "empty_query"
    TOO_MANY_ITEMS = "too_many_items"
    TOO_MANY_CHUNKS = "too_many_chunks"  # a chunked rerank's chunks over max_items_per_request
    INVALID_CHUNKING = "invalid_chunking"  # chunk_overlap not below chunk_tokens
    SEQUENCE_TOO_LONG = "sequence_too_long"
    TOO_MANY_LABELS = "too_many_labels"
    TOO_MANY_TOKENS = "too_many_tokens"
    DELIMITER_IN_CONTENT = "delimiter_in_content"
    EMPTY_PROMPT = "empty_prompt"
    EMPTY_INPUT = "empty_input"  # an empty embedding input (text, token list or list)
    INVALID_DIMENSIONS = "invalid_dimensions"  # Matryoshka dimensions outside 1..dimension
    DIMENSIONS_NOT_SUPPORTED = "dimensions_not_supported"  # a cut the model was not trained for
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


# The HTTP status of a reason when the raiser names none; every other reason is a 400.
STATUS_OF = {
    Reason.UNAUTHORIZED: 401,
    Reason.NOT_FOUND: 404,
    Reason.MODEL_NOT_FOUND: 404,
    Reason.METHOD_NOT_ALLOWED: 405,
    Reason.INTERNAL: 500,
    Reason.OVERLOADED: 503,
    Reason.UNAVAILABLE: 503,
}

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ScoringError(ValueError):
    """A request answered with an error envelope instead of scores: a broken rule or limit
    (400), an unknown model (404), an overloaded or failed replica (503), a defect (500).

    ``status_code`` defaults to the reason's (``STATUS_OF``, else 400); ``retry_after_s`` is
    the Retry-After header of a 503, if any; ``excess_wait_s``, an ``overloaded`` refusal's
    expected wait beyond ``max_queue_wait_s`` (app.refusals). ``engine_failure`` is set (the
    engine's exception, as ``repr``) when the engine failed on a step rather than refusing
    the work: a retryable 503 ``unavailable`` until the replica finds the engine fails on
    this request alone (``failed_on_this_request``). Picklable (``__reduce__``): a
    DeploymentHandle caller catches it by type and reads ``body``, the exact JSON the HTTP
    route sends. A ValueError, as every refusal of bad input was (Ray Data's
    ``should_continue_on_error`` keys on it).
    """

    def __init__(
        self,
        reason: Reason | str,
        message: str,
        param: str | None = None,
        status_code: int | None = None,
        retry_after_s: int | None = None,
        engine_failure: str | None = None,
        excess_wait_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = Reason(reason)
        self.message = message
        self.param = param
        self.status_code = STATUS_OF.get(self.reason, 400) if status_code is None else status_code
        self.retry_after_s = retry_after_s
        self.engine_failure = engine_failure
        self.excess_wait_s = excess_wait_s

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.reason.value, self.message, self.param, self.status_code)
        extra = (self.retry_after_s, self.engine_failure, self.excess_wait_s)
        return (type(self), (*fields, *extra))

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


def engine_failed(cause: str) -> ScoringError:
    """The answer to a work whose step raised ``cause`` (not a refusal of the work): 503
    ``unavailable``, retryable, another replica may answer."""
    message = f"scoring engine failed ({cause}); retry, another replica may answer"
    return ScoringError(Reason.UNAVAILABLE, message, None, 503, 1, engine_failure=cause)


def failed_on_this_request(error: ScoringError) -> ScoringError:
    """``engine_failed``'s answer once the engine is seen to score other work: a defect of
    the engine on this request (500), which fails the same way on every retry."""
    return ScoringError(
        Reason.INTERNAL,
        f"the scoring engine failed on this request ({error.engine_failure}) and scores others: "
        "a defect, logged with its trace; sending it again fails the same way",
    )


class EngineUnavailable(RuntimeError):
    """The engine cannot score now (a host of its group died or stalled): its replica answers
    503 ``unavailable`` and reports itself unhealthy, so Serve replaces it. Not a
    ScoringError: the engine, not the request, is what this says is broken."""
