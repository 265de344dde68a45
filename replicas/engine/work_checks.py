"""The engine's own checks of the work it is handed: anything that breaks one raises before a
step runs, with the HTTP 400's ``reason``. Limits are not among them: the replica checks
them (``check_model_limits``), and a batch job before its engine does."""

from __future__ import annotations

import itertools

from replicas.contract import MAX_TOP_LOGPROBS, EmbedWork, ModelInfo, PromptWork, ScoreWork
from replicas.engine.layouts.embed import check_embed_work
from replicas.errors import Reason, ScoringError


def validate_work(work: ScoreWork | PromptWork | EmbedWork, info: ModelInfo, multi: bool) -> None:
    """Raise ScoringError for work that must not run on the model
    ``info`` describes; ``multi``: a ScoreWork runs through a multi-item layout."""
    vocab = info.vocab_size
    if isinstance(work, EmbedWork) or info.model_kind.embeds:
        check_embed_work(work, info)
        return
    if isinstance(work, PromptWork):
        _validate_prompts(work, info)
        return
    if not work.query_ids:
        raise ScoringError(Reason.EMPTY_QUERY, "query must contain at least one token")
    if not work.label_ids:
        raise ScoringError(Reason.EMPTY_LABEL_TOKEN_IDS, "label_token_ids must not be empty")
    ids = itertools.chain(work.query_ids, work.label_ids, *work.item_ids)
    if any(not 0 <= token < vocab for token in ids):
        raise ScoringError(Reason.TOKEN_ID_EXCEEDS_VOCAB, f"token ids must be in [0, {vocab})")
    head = info.head  # a head model's labels index its outputs
    if head is not None and max(work.label_ids) >= head.num_labels:
        raise ScoringError(Reason.INVALID_REQUEST, f"head outputs are [0, {head.num_labels})")
    delimiter = info.multi_item_scoring_delimiter
    if multi and any(delimiter in part for part in (work.query_ids, *work.item_ids)):
        raise ScoringError(
            Reason.DELIMITER_IN_CONTENT, f"delimiter token {delimiter} inside query or item"
        )


def _validate_prompts(work: PromptWork, info: ModelInfo) -> None:
    vocab = info.vocab_size
    if not info.model_kind.lm_head:
        raise ScoringError(Reason.NO_LM_HEAD, "a score-head model has no token log-probs")
    if any(not prompt for prompt in work.prompts):
        raise ScoringError(Reason.EMPTY_PROMPT, "every prompt must contain at least one token")
    if any(not 0 <= token < vocab for token in itertools.chain(*work.prompts)):
        raise ScoringError(Reason.TOKEN_ID_EXCEEDS_VOCAB, f"token ids must be in [0, {vocab})")
    if not 0 <= work.top_k <= MAX_TOP_LOGPROBS:
        raise ScoringError(Reason.INVALID_REQUEST, f"top_k must be in [0, {MAX_TOP_LOGPROBS}]")
    if work.scored_tail is not None and work.scored_tail < 1:
        raise ScoringError(Reason.INVALID_REQUEST, "scored_tail must be None or >= 1")
