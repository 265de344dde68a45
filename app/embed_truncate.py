"""Cohere's ``truncate: START`` on /v2/embed (semantics 20): a text whose input overflows the
model's limit loses its start, at a token boundary, until it fits.

The cut text is ``text[o:]``, ``o`` the start offset (the fast tokenizer's mapping, in
codepoints) of one of the text's own tokens (tokenized alone, no special tokens), the
smallest such ``o`` whose input -- prompt, special tokens, chat template as
``app.embed_inputs`` prepares any text -- fits the limit; it is then embedded as that text
sent alone would be (the prompt and the model's special tokens kept whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.embed_inputs import CHARS_PER_TOKEN
from app.tokenization import fast_offsets
from replicas.errors import Reason, ScoringError

Length = Callable[[str], int]  # a text -> its input's token count, as it would be embedded


def cut_start(tokenizer: Any, text: str, limit: int, length: Length) -> str:
    """``text`` less its first tokens, the longest tail (at a token start) whose input fits
    ``limit`` tokens; ``text`` itself when it fits."""
    if length(text) <= limit:
        return text
    width = (limit + 1) * CHARS_PER_TOKEN  # a tail this long overflows: the cut lies inside
    base = max(0, len(text) - width)
    (offsets,) = fast_offsets(tokenizer, [text[base:]], "truncate")  # its tokens, no specials
    starts = [base + s for s in sorted({start for start, _ in offsets})]
    starts = starts[1:] if base else starts  # the tail's first token may be a word's middle
    low, high = 0, len(starts)  # starts[high:] fit (an empty tail counts as fitting)
    while low < high:  # the smallest index whose tail fits: tails only shrink as it grows
        mid = (low + high) // 2
        if length(text[starts[mid] :]) <= limit:
            high = mid
        else:
            low = mid + 1
    if low == len(starts):
        raise ScoringError(
            Reason.SEQUENCE_TOO_LONG,
            f"texts: the prompt and special tokens alone exceed {limit} tokens",
            "texts",
        )
    return text[starts[low] :]


def cut_starts(tokenizer: Any, texts: Sequence[str], limit: int, length: Length) -> list[str]:
    """Each text cut at its start to fit (``cut_start``)."""
    return [cut_start(tokenizer, text, limit, length) for text in texts]
