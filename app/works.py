"""Works prepared by a caller with app/'s own code (a batch job's CPU stage), checked again
at the ingress before they reach the replicas: token ids inside the vocabulary, the
delimiter rule and the shared limits (the checks the routes run once text is token ids)."""

from __future__ import annotations

from app.validation import check_token_ids, check_work
from replicas.contract import (
    EmbedWork,
    ModelInfo,
    PromptWork,
    ScoreWork,
    check_embed_limits,
    check_limits,
)
from replicas.errors import ScoringError


def check_prepared(work: ScoreWork | PromptWork | EmbedWork, info: ModelInfo) -> None:
    """Raise ScoringError (a 400) where ``work`` breaks a rule of its route."""
    if isinstance(work, EmbedWork):
        for tokens in work.inputs:
            check_token_ids(tokens, info.vocab_size, "input")
        try:
            check_embed_limits(
                work, info.limits, info.pooling.max_seq_length if info.pooling else None
            )
        except ScoringError as error:
            raise ScoringError(error.reason, error.message, "input") from None
        return
    if isinstance(work, PromptWork):
        for prompt in work.prompts:
            check_token_ids(prompt, info.vocab_size, "prompt")
        try:
            check_limits(work, info.limits, multi_item=True)
        except ScoringError as error:
            raise ScoringError(error.reason, error.message, "prompt") from None
        return
    check_token_ids(work.query_ids, info.vocab_size, "query")
    for item in work.item_ids:
        check_token_ids(item, info.vocab_size, "items")
    check_work(work, info)
