"""Texts -> token ids for an embedding model, as sentence-transformers 6.2 prepares them
(semantics 20; the model's ``InputFormat``, read by ``replicas.model.st_inputs``).

``text``: ``prompt + text`` tokenized with the tokenizer's special tokens (its
post-processing: Qwen3-Embedding's appended ``<|endoftext|>``); a cut keeps the tokenizer's
own truncation, so appended special tokens stay. With ``include_prompt`` False the prompt's
tokens (encoded alone, less a trailing special token) are left out of the pooling.

``chat_template``: each text is one conversation, ``[system: prompt]`` (only for a non-empty
prompt; without one the template renders its default system turn) then ``user: text``,
rendered by the tokenizer's chat template with no generation prompt and tokenized without
special tokens (``apply_chat_template``). Cut to ``keep`` tokens, an input gets the template's
tail back over its last tokens (sentence-transformers' ``restore_suffix``): the longest common
token suffix of the conversation rendered with the fillers ``"0"`` and ``"1 2 3 4"`` as the
user's text. No prompt tokens are left out of the pooling.

Either way a text longer than ``(limit + 1) * CHARS_PER_TOKEN`` characters is tokenized cut to
that first; only when the cut text stays within the limit is the whole text tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replicas.embed_contract import InputFormat, PoolingHead

CHARS_PER_TOKEN = 32  # a text cut to (limit + 1) * this many characters still overflows
FILLERS = ("0", "1 2 3 4")  # two user texts that tokenize apart: what they share is template


@dataclass(frozen=True)
class EncodedInputs:
    """Each input's token ids and how many leading tokens are its prompt (0: none)."""

    inputs: tuple[tuple[int, ...], ...]
    skip: int


def _ids(rows: Any) -> list[tuple[int, ...]]:
    return [tuple(int(t) for t in ids) for ids in rows]


def prompt_length(tokenizer: Any, prompt: str) -> int:
    """The prompt's tokens, as sentence-transformers counts them for ``include_prompt``:
    encoded alone, less a trailing special token the tokenizer appends."""
    ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return len(ids) - (1 if ids and ids[-1] in special else 0)


def conversation(text: str, prompt: str | None, form: InputFormat) -> list[dict[str, Any]]:
    """One input as sentence-transformers' messages: the prompt as a system message."""

    def message(role: str, content: str) -> dict[str, Any]:
        if form.message_format == "flat":
            return {"role": role, "content": content}
        return {"role": role, "content": [{"type": "text", "text": content}]}

    system = [message("system", prompt)] if prompt else []
    return [*system, message("user", text)]


def render_chat(
    tokenizer: Any, texts: Sequence[str], prompt: str | None, form: InputFormat
) -> list[tuple[int, ...]]:
    """Each text rendered through the chat template and tokenized, uncut."""
    chats = [conversation(text, prompt, form) for text in texts]
    variables = {"add_generation_prompt": False, **form.template_variables()}
    rendered = tokenizer.apply_chat_template(chats, tokenize=False, **variables)
    return _ids(tokenizer(list(rendered), add_special_tokens=False)["input_ids"])


def chat_suffix(tokenizer: Any, prompt: str | None, form: InputFormat) -> tuple[int, ...]:
    """The template's tail after the user's text (() when the renders never differ)."""
    first, second = render_chat(tokenizer, FILLERS, prompt, form)
    count = 0
    for left, right in zip(reversed(first), reversed(second), strict=False):
        if left != right:
            break
        count += 1
    return first[len(first) - count :] if 0 < count < min(len(first), len(second)) else ()


def cut_chat(ids: tuple[int, ...], keep: int, suffix: tuple[int, ...]) -> tuple[int, ...]:
    """The first ``keep`` tokens, their last ones overwritten by the template's tail."""
    if len(ids) < keep:
        return ids
    tail = suffix[len(suffix) - min(len(suffix), keep) :]
    return ids[: keep - len(tail)] + tail


def _encode(tokenizer: Any, texts: Sequence[str], prompt: str | None, form: InputFormat,
            keep: int | None) -> list[tuple[int, ...]]:  # fmt: skip
    if form.chat:
        return render_chat(tokenizer, texts, prompt, form)
    kwargs: dict[str, Any] = {"add_special_tokens": True}
    if keep is not None:
        kwargs.update(truncation=True, max_length=keep)
    full = [f"{prompt}{text}" if prompt else text for text in texts]
    return _ids(tokenizer(full, **kwargs)["input_ids"])


def encode_inputs(
    tokenizer: Any, texts: Sequence[str], prompt: str | None, head: PoolingHead, limit: int,
    keep: int | None,
) -> EncodedInputs:  # fmt: skip
    """Each text's ids behind ``prompt`` as the model's InputFormat prepares it; ``keep``:
    cut to that many tokens (``limit``: the most an uncut input may hold)."""
    form = head.inputs
    width = (max(limit, keep or 0) + 1) * CHARS_PER_TOKEN
    encoded = _encode(tokenizer, [text[:width] for text in texts], prompt, form, keep)
    # The cut text decides unless it came out short: fewer than ``keep`` tokens (a cut to
    # ``keep`` always has at most that many, so ``<=`` would tokenize every long text whole
    # again), or with no ``keep`` within the limit.
    enough = keep if keep is not None else limit + 1
    for i, text in enumerate(texts):
        if len(text) > width and len(encoded[i]) < enough:
            encoded[i] = _encode(tokenizer, [text], prompt, form, keep)[0]
    if form.chat and keep is not None and any(len(ids) >= keep for ids in encoded):
        suffix = chat_suffix(tokenizer, prompt, form) if form.restore_suffix else ()
        encoded = [cut_chat(ids, keep, suffix) for ids in encoded]
    skip = 0
    if prompt and not head.include_prompt and not form.chat:
        skip = prompt_length(tokenizer, prompt)
    return EncodedInputs(tuple(encoded), skip)
