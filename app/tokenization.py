"""Text -> token ids, semantics 2: the query WITH special tokens, each item WITHOUT.

The two are joined as token ids (never as text), in single-item and multi-item mode alike, so
the mode never changes a score. Token inputs pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from replicas.errors import Reason, ScoringError


class TextTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the ingress uses."""

    def __call__(self, text: Any, *, add_special_tokens: bool = ...) -> Any: ...


@dataclass(frozen=True)
class Tokenized:
    query_ids: tuple[int, ...]
    item_ids: tuple[tuple[int, ...], ...]

    @property
    def prompt_tokens(self) -> int:
        """Tokens the model reads, counted as single-item rows (query + item per item)."""
        return sum(len(self.query_ids) + len(item) for item in self.item_ids)


def encode_text(tokenizer: TextTokenizer, query: str, items: Sequence[str]) -> Tokenized:
    """Encode a text request; items are encoded as one batch (fast tokenizers use threads)."""
    query_ids = tuple(int(t) for t in tokenizer(query, add_special_tokens=True)["input_ids"])
    item_ids: tuple[tuple[int, ...], ...] = ()
    if items:
        encoded = tokenizer(list(items), add_special_tokens=False)["input_ids"]
        item_ids = tuple(tuple(int(t) for t in ids) for ids in encoded)
    return Tokenized(query_ids, item_ids)


def pass_tokens(query: Sequence[int], items: Sequence[Sequence[int]]) -> Tokenized:
    return Tokenized(tuple(query), tuple(tuple(item) for item in items))


def fast_offsets(tokenizer: Any, texts: Sequence[str], param: str) -> list[list[tuple[int, int]]]:
    """Each text's tokens (no special tokens) as [start, end) codepoint offsets, from a fast
    tokenizer's offset mapping; a 400 naming ``param`` (what asked for them) without one."""
    if not texts:
        return []
    try:
        encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError) as error:
        raise ScoringError(
            Reason.INVALID_REQUEST, f"{param}: needs a fast tokenizer's offsets ({error})", param
        ) from None
    return [[(int(s), int(e)) for s, e in row] for row in encoded["offset_mapping"]]
