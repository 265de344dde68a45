"""The engine's own checks of the work it is handed (the ingress runs the same rules first):
anything that breaks one raises before a step runs, with the HTTP 400's ``reason``."""

from __future__ import annotations

import itertools

from replicas.contract import (
    MAX_TOP_LOGPROBS,
    EmbedWork,
    ModelInfo,
    PromptWork,
    ScoreWork,
    check_limits,
)
from replicas.engine.layouts.embed import check_embed_work


class ScoringInputError(ValueError):
    """Work the ingress should have rejected; ``reason`` matches the HTTP 400 reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def validate_work(work: ScoreWork | PromptWork | EmbedWork, info: ModelInfo, multi: bool) -> None:
    """Raise ScoringInputError / ScoringLimitError for work that must not run on the model
    ``info`` describes; ``multi``: a ScoreWork runs through a multi-item layout."""
    vocab = info.vocab_size
    if isinstance(work, EmbedWork) or info.pooling is not None:
        check_embed_work(work, info)
        return
    if isinstance(work, PromptWork):
        _validate_prompts(work, info)
        return
    if not work.query_ids:
        raise ScoringInputError("empty_query", "query must contain at least one token")
    if not work.label_ids:
        raise ScoringInputError("empty_label_token_ids", "label_token_ids must not be empty")
    ids = itertools.chain(work.query_ids, work.label_ids, *work.item_ids)
    if any(not 0 <= token < vocab for token in ids):
        raise ScoringInputError("token_id_exceeds_vocab", f"token ids must be in [0, {vocab})")
    head = info.head  # a head model's labels index its outputs
    if head is not None and max(work.label_ids) >= head.num_labels:
        raise ScoringInputError("invalid_request", f"head outputs are [0, {head.num_labels})")
    check_limits(work, info.limits, multi)
    delimiter = info.multi_item_scoring_delimiter
    if multi and any(delimiter in part for part in (work.query_ids, *work.item_ids)):
        raise ScoringInputError(
            "delimiter_in_content", f"delimiter token {delimiter} inside query or item"
        )


def _validate_prompts(work: PromptWork, info: ModelInfo) -> None:
    vocab = info.vocab_size
    if info.head is not None:
        raise ScoringInputError("no_lm_head", "a score-head model has no token log-probs")
    if any(not prompt for prompt in work.prompts):
        raise ScoringInputError("empty_prompt", "every prompt must contain at least one token")
    if any(not 0 <= token < vocab for token in itertools.chain(*work.prompts)):
        raise ScoringInputError("token_id_exceeds_vocab", f"token ids must be in [0, {vocab})")
    if not 0 <= work.top_k <= MAX_TOP_LOGPROBS:
        raise ScoringInputError("invalid_logprobs", f"top_k must be in [0, {MAX_TOP_LOGPROBS}]")
    if work.scored_tail is not None and work.scored_tail < 1:
        raise ScoringInputError("invalid_request", "scored_tail must be None or >= 1")
    check_limits(work, info.limits, True)
