"""The embedding half of the contract between the ingress and the replicas (semantics 20).

Jax-free, like ``replicas.contract`` (which re-exports these): token ids in, float32 vectors
out.
"""

from __future__ import annotations

from dataclasses import dataclass

POOLINGS = ("lasttoken", "mean", "cls")


@dataclass(frozen=True)
class PoolingHead:
    """An embedding model's pooling (semantics 20): one vector per input, read from the
    decoder's final hidden states in float32. ``lasttoken``: the last real token's state;
    ``mean``: the average over real tokens; ``cls``: the first token's. ``include_prompt``
    False leaves an input's prompt tokens out of the pooling (sentence-transformers'
    ``include_prompt``). ``dense``: (in, out, activation) of each Dense layer after pooling
    (activation ``tanh`` or ``identity``); then L2 normalization when ``normalize``.
    ``prompts``: the model's named prompt texts, prepended to an input's text as
    sentence-transformers prepends them; ``max_seq_length``: the most tokens per input."""

    pooling: str
    normalize: bool
    dimension: int
    include_prompt: bool = True
    dense: tuple[tuple[int, int, str], ...] = ()
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    max_seq_length: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling: {self.pooling!r} not in {POOLINGS}")
        if self.dimension < 1:
            raise ValueError(f"dimension: must be >= 1, got {self.dimension}")

    def prompt(self, name: str) -> str | None:
        """The text of the prompt called ``name`` (None: the model has no such prompt)."""
        return dict(self.prompts).get(name)


@dataclass(frozen=True)
class EmbedWork:
    """Embeddings (semantics 20) in token space: one float32 vector per input, pooled as the
    model's PoolingHead says, before any Matryoshka cut (the ingress does that). The first
    ``prompt_lengths[i]`` tokens of input i are its prompt (pooled only with
    ``include_prompt``); () means none has one."""

    inputs: tuple[tuple[int, ...], ...]
    prompt_lengths: tuple[int, ...] = ()
    deadline: float | None = None
    adapter: str | None = None  # a LoRA adapter's name (semantics 21); None: the base model

    @property
    def num_items(self) -> int:
        return len(self.inputs)

    def prompt_length(self, i: int) -> int:
        return self.prompt_lengths[i] if self.prompt_lengths else 0
