"""/v1/completions (semantics 14): prompt log-likelihood in OpenAI's completions shape.

Prefill-only: every prompt token's log-probability and top alternatives (``echo``), and at
most one greedy next token (``max_tokens`` 1, temperature 0). This is what evaluation
harnesses read to score multi-token answers (lm-evaluation-harness's ``local-completions``:
``echo: true, logprobs: 1, max_tokens: 1, temperature: 0``). The tokenizer routes
(``/tokenize``, ``/detokenize``, ``/tokenizer_info``) let such a client use the served
tokenizer instead of its own.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.schema import CompletionRequest, DetokenizeRequest, TokenizeRequest
from app.validation import check_model_name, check_token_ids, check_unicode, validate_body
from replicas.contract import (
    ModelInfo,
    PromptLogprobs,
    PromptWork,
    check_limits,
)
from replicas.errors import Reason, ScoringError


@dataclass(frozen=True)
class Prompts:
    """A completions request that passed every rule: its prompts as token ids, and each
    prompt's text when it came as text (echoed back as it was sent)."""

    request: CompletionRequest
    work: PromptWork
    texts: tuple[str | None, ...]

    @property
    def generated(self) -> int:
        return self.request.max_tokens or 0


def prompt_list(prompt: Any) -> list[str] | list[list[int]]:
    """The request's ``prompt`` as a batch: one text or one token list becomes a batch of one."""
    if isinstance(prompt, str) or (prompt and all(isinstance(token, int) for token in prompt)):
        return [prompt]
    return list(prompt)


def check_generation(request: CompletionRequest) -> None:
    """Only what a prefill can answer: at most one greedy token, one choice, no stream."""
    refusals = (
        ("max_tokens", request.max_tokens is not None and not 0 <= request.max_tokens <= 1,
         "max_tokens must be 0 or 1: this server scores prompts and generates no more than "
         "the one greedy next token"),
        ("n", request.n not in (None, 1), "n must be 1: one choice per prompt"),
        ("best_of", request.best_of not in (None, 1), "best_of must be 1"),
        ("stream", bool(request.stream), "stream is not supported: answers come whole"),
        ("suffix", request.suffix is not None, "suffix (insertion) is not supported"),
        ("temperature", (request.max_tokens or 0) > 0 and (request.temperature or 0) != 0,
         "temperature must be 0 or absent: the next token is the greedy one, never sampled"),
    )  # fmt: skip
    for param, refused, message in refusals:
        if refused:
            raise ScoringError(Reason.GENERATION_NOT_SUPPORTED, message, param)


@dataclass(frozen=True)
class Completions:
    """The served tokenizer bound to the model: completions and tokenizer route bodies."""

    tokenizer: Any  # a Hugging Face tokenizer (encode, decode, special tokens)
    info: ModelInfo

    def prepare(self, payload: Any) -> Prompts:
        """Validate and tokenize a completions body; raises ScoringError (400)."""
        request = validate_body(payload, CompletionRequest)
        adapter = check_model_name(request.model, self.info)
        check_generation(request)
        prompts = prompt_list(request.prompt)
        if not prompts:
            raise ScoringError(Reason.EMPTY_PROMPT, "prompt lists no prompt", "prompt")
        limit = self.info.limits.max_items_per_request
        if len(prompts) > limit:
            message = f"{len(prompts)} prompts exceed max_items_per_request={limit}"
            raise ScoringError(Reason.TOO_MANY_ITEMS, message, "prompt")
        texts: tuple[str | None, ...] = tuple(p if isinstance(p, str) else None for p in prompts)
        ids = [self._encode(p) if isinstance(p, str) else list(p) for p in prompts]
        for tokens in ids:
            if not tokens:
                message = "every prompt must hold at least one token"
                raise ScoringError(Reason.EMPTY_PROMPT, message, "prompt")
            check_token_ids(tokens, self.info.vocab_size, "prompt")
        work = PromptWork(tuple(tuple(t) for t in ids), request.logprobs or 0, adapter=adapter)
        try:
            check_limits(work, self.info.limits, multi_item=True)
        except ScoringError as error:
            raise ScoringError(error.reason, error.message, "prompt") from None
        return Prompts(request, work, texts)

    def _encode(self, text: str) -> list[int]:
        check_unicode(text, "prompt")
        return [int(t) for t in self.tokenizer(text, add_special_tokens=True)["input_ids"]]

    def body(
        self, prompts: Prompts, answers: Sequence[PromptLogprobs], created: int
    ) -> dict[str, Any]:
        """OpenAI's text_completion body, one choice per prompt."""
        choices = [
            self._choice(i, prompts, tokens, answer)
            for i, (tokens, answer) in enumerate(zip(prompts.work.prompts, answers, strict=True))
        ]
        prompt_tokens = sum(len(p) for p in prompts.work.prompts)
        generated = prompts.generated * len(choices)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": created,
            "model": prompts.work.adapter or self.info.name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": generated,
                "total_tokens": prompt_tokens + generated,
            },
        }

    def _choice(
        self, index: int, prompts: Prompts, tokens: tuple[int, ...], answer: PromptLogprobs
    ) -> dict[str, Any]:
        request = prompts.request
        k = request.logprobs or 0
        shown: list[int] = list(tokens) if request.echo else []
        logprobs: list[float | None] = [_number(x) for x in answer.token_logprobs] if shown else []
        tops: list[dict[str, float] | None] = []
        if shown:  # the first token's entry is null: nothing precedes it
            chosen = zip(tokens[1:], answer.token_logprobs[1:], strict=True)
            tops = [None, *(self._top(answer, j, k, c) for j, c in enumerate(chosen, 1))]
        if prompts.generated:
            greedy = (int(answer.top_ids[len(tokens), 0]), answer.top_logprobs[len(tokens), 0])
            shown.append(greedy[0])
            logprobs.append(_number(greedy[1]))
            tops.append(self._top(answer, len(tokens), k, greedy))
        pieces = self._pieces(shown)
        prompt_text = prompts.texts[index]
        if prompt_text is None and request.echo:
            prompt_text = self.tokenizer.decode(list(tokens))
        generated_text = pieces[-1] if prompts.generated else ""
        text = (prompt_text if request.echo else "") + generated_text
        start = 0 if request.echo else len(prompt_text or "")
        offsets, cursor = [], start
        for piece in pieces:
            offsets.append(cursor)
            cursor += len(piece)
        listed = {"tokens": pieces, "token_logprobs": logprobs, "top_logprobs": tops}
        listed["text_offset"] = offsets
        listed_or_none = None if request.logprobs is None else listed
        return {"index": index, "text": text, "finish_reason": "length", "logprobs": listed_or_none}

    def _top(
        self, answer: PromptLogprobs, row: int, k: int, chosen: tuple[int, float]
    ) -> dict[str, float]:
        """Position ``row``'s top-k as {token text: log-prob}, best first; with ``logprobs:
        0``, the ``chosen`` (token id, log-prob) alone: the prompt's token there, or the
        greedy one (OpenAI's and vLLM's legacy completions)."""
        if k == 0:
            return {self._pieces([chosen[0]])[0]: float(chosen[1])}
        ids, values = answer.top_ids[row, :k], answer.top_logprobs[row, :k]
        pieces = self._pieces([int(t) for t in ids])
        return {piece: float(v) for piece, v in zip(pieces, values, strict=True)}

    def _pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text."""
        return list(self.tokenizer.batch_decode([[t] for t in ids])) if ids else []

    # -- tokenizer routes ---------------------------------------------------------------

    @property
    def longest_prompt(self) -> int:
        """The most tokens a prompt may have here (warm-up's bound, else a step's)."""
        limits = self.info.limits
        return limits.max_prompt_tokens or limits.max_row_tokens

    def tokenize(self, payload: Any) -> dict[str, Any]:
        request = validate_body(payload, TokenizeRequest)
        check_model_name(request.model, self.info)
        check_unicode(request.prompt, "prompt")
        encoded = self.tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)
        tokens = [int(t) for t in encoded["input_ids"]]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.longest_prompt}

    def detokenize(self, payload: Any) -> dict[str, Any]:
        request = validate_body(payload, DetokenizeRequest)
        check_model_name(request.model, self.info)
        check_token_ids(request.tokens, self.info.vocab_size, "tokens")
        return {"prompt": self.tokenizer.decode(request.tokens)}

    def tokenizer_info(self) -> dict[str, Any]:
        tokenizer = self.tokenizer
        return {
            "tokenizer_class": type(tokenizer).__name__,
            "eos_token": tokenizer.eos_token,
            "bos_token": tokenizer.bos_token,
            "pad_token": tokenizer.pad_token,
            "unk_token": tokenizer.unk_token,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "model_max_length": self.longest_prompt,
            "vocab_size": self.info.vocab_size,
        }


def _number(value: float) -> float | None:
    """A log-prob for JSON: NaN (no context before the first token) is null."""
    value = float(value)
    return None if math.isnan(value) else value
