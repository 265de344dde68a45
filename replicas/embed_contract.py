"""The embedding half of the contract between the ingress and the replicas (semantics 20).

Jax-free, like ``replicas.contract`` (which re-exports these): token ids in, float32 vectors
out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from replicas.answers import HybridVectors, SparseVectors, TokenVectors, Vectors
from replicas.errors import Reason, ScoringError

POOLINGS = ("lasttoken", "mean", "cls")
# What an EmbedWork asks for (``EmbedWork.output``): one vector per input, every token's
# vector (a late-interaction model's), or a vocabulary-wide sparse vector (a sparse model's)
# (a hybrid model's: all three from one pass, ``HybridVectors``)
OUTPUTS = ("vector", "tokens", "sparse", "hybrid")
INPUT_FORMATS = ("text", "chat_template")
MESSAGE_FORMATS = ("flat", "structured")
ANSWERS: dict[str, Any] = {
    "vector": Vectors, "tokens": TokenVectors, "sparse": SparseVectors, "hybrid": HybridVectors,
}  # fmt: skip


@dataclass(frozen=True)
class InputFormat:
    """How an input's text becomes token ids, as sentence-transformers 6.2's Transformer
    prepares it (``replicas.model.st_inputs`` reads it). ``text``: the prompt's text in
    front of the input's, tokenized with the tokenizer's special tokens. ``chat_template``
    (the ``message`` modality): the input as a user message behind a system message holding
    the prompt (no prompt: the template's default system turn), rendered through the
    tokenizer's chat template without a generation prompt and tokenized without special
    tokens; a cut input gets the template's tail back (``restore_suffix``).
    ``message_format``: a message's content as a string (``flat``) or as
    ``[{"type": "text", "text": ...}]`` (``structured``); ``template_kwargs``: further
    variables for the template (``processing_kwargs.chat_template``), each value as JSON
    (hashable)."""

    kind: str = "text"
    message_format: str = "flat"
    template_kwargs: tuple[tuple[str, str], ...] = ()
    restore_suffix: bool = True

    def __post_init__(self) -> None:
        if self.kind not in INPUT_FORMATS:
            raise ValueError(f"input format: {self.kind!r} not in {INPUT_FORMATS}")
        if self.message_format not in MESSAGE_FORMATS:
            raise ValueError(f"message format: {self.message_format!r} not in {MESSAGE_FORMATS}")

    @property
    def chat(self) -> bool:
        return self.kind == "chat_template"

    def template_variables(self) -> dict[str, Any]:
        return {name: json.loads(value) for name, value in self.template_kwargs}


@dataclass(frozen=True)
class LateInteraction:
    """A late-interaction (ColBERT) model's token vectors (semantics 20), as
    sentence-transformers 6's ``MultiVectorEncoder`` reads its directory: every token's final
    hidden state through the bias-free Dense projections, then L2-normalized per token.

    ``query_length``: a query is cut to, then filled with ``expansion_token`` (None: the
    tokenizer's mask token) up to, this many tokens (``query_expansion``; None: no
    expansion; ``expansion`` ``fixed`` cuts, ``min`` only fills); ``attend_expansion``
    False: the encoder does not read the fill tokens (their own vectors still read the
    query), PyLate's ``attend_to_expansion_tokens``. ``query_max_length`` and
    ``document_length``: the most tokens of each (None: the model's). ``skiplist``: words
    whose tokens a document's scoring leaves out (``MultiVectorMask``), in the inputs of
    ``skiplist_tasks``. ``similarity``: ``maxsim`` (the sum over query tokens of the best
    document token's dot product) or ``meanmaxsim`` (over the query's token count)."""

    query_length: int | None = None
    expansion: str = "fixed"
    attend_expansion: bool = False
    expansion_token: str | None = None
    query_max_length: int | None = None
    document_length: int | None = None
    skiplist: tuple[str, ...] = ()
    skiplist_tasks: tuple[str, ...] = ("document",)
    similarity: str = "maxsim"

    def __post_init__(self) -> None:
        if self.expansion not in ("fixed", "min"):
            raise ValueError(f"query_expansion strategy: {self.expansion!r} not fixed or min")
        if self.similarity not in ("maxsim", "meanmaxsim"):
            raise ValueError(f"similarity_fn_name: {self.similarity!r} not maxsim/meanmaxsim")


@dataclass(frozen=True)
class SparseOutput:
    """A sparse (SPLADE) model's vector (semantics 20), as sentence-transformers 6's
    ``SparseEncoder`` computes it: the masked-LM head's logits per token, ``log(1 +
    relu(x))`` (``log1p_relu``: that twice), then the max (``sum``: the sum) over an input's
    tokens, one weight per vocabulary token; ``max_active_dims``: only the largest that many
    kept (None: every non-zero weight)."""

    pooling: str = "max"
    activation: str = "relu"
    max_active_dims: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in ("max", "sum"):
            raise ValueError(f"SpladePooling pooling_strategy: {self.pooling!r} not max/sum")
        if self.activation not in ("relu", "log1p_relu"):
            raise ValueError(f"SpladePooling activation_function: {self.activation!r}")
        if self.max_active_dims is not None and self.max_active_dims < 1:
            raise ValueError(f"max_active_dims: must be >= 1, got {self.max_active_dims}")


@dataclass(frozen=True)
class Hybrid:
    """BGE-M3's three outputs from one pass (semantics 20), as FlagEmbedding's
    ``BGEM3FlagModel`` computes them from the final hidden states: the dense vector (the
    model's own pooling, [CLS], normalized), the multi-vector (``colbert_linear`` on every
    token after [CLS], normalized per token: ``colbert_dimension`` wide) and the lexical
    weights (``relu(sparse_linear(h))`` per token; the ingress keeps each token id's largest,
    special tokens left out). ``weights``: the dense, sparse and multi-vector scores' weights
    in the hybrid score (their weighted mean)."""

    colbert_dimension: int
    weights: tuple[float, float, float] = (0.4, 0.2, 0.4)


@dataclass(frozen=True)
class PoolingHead:
    """An embedding model's pooling (semantics 20): one vector per input, read from the
    decoder's final hidden states in float32. ``lasttoken``: the last real token's state;
    ``mean``: the average over real tokens; ``cls``: the first token's. ``include_prompt``
    False leaves an input's prompt tokens out of the pooling (sentence-transformers'
    ``include_prompt``). ``dense``: (in, out, activation) of each Dense layer after pooling
    (activation ``tanh`` or ``identity``); then L2 normalization when ``normalize``.
    ``prompts``: the model's named prompt texts, prepended to an input's text as
    sentence-transformers prepends them; ``max_seq_length``: the most tokens per input;
    ``inputs``: how text becomes token ids (a chat template's render leaves no prompt
    tokens out of the pooling, whatever ``include_prompt`` says, as sentence-transformers).
    ``matryoshka``: the sizes a request may cut the vector to (``dimensions``), as the model
    declares them or the config says: None: none (not trained for a cut), (): any of
    1..dimension, else those. The ingress's rule alone (the replica never cuts), so it is
    not compared: an ingress and a replica agree on a head whatever it says. ``late``: a
    late-interaction model's token vectors (``pooling`` then ``tokens``, ``dimension`` the
    projection's); ``sparse``: a sparse model's weights (``pooling`` ``splade``,
    ``dimension`` the vocabulary's); ``hybrid``: BGE-M3's three outputs (``pooling`` its
    dense vector's, ``dimension`` that vector's)."""

    pooling: str
    normalize: bool
    dimension: int
    include_prompt: bool = True
    dense: tuple[tuple[int, int, str], ...] = ()
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    inputs: InputFormat = field(default_factory=InputFormat)
    matryoshka: tuple[int, ...] | None = field(default=None, compare=False)
    late: LateInteraction | None = None
    sparse: SparseOutput | None = None
    hybrid: Hybrid | None = None

    def __post_init__(self) -> None:
        expected = "tokens" if self.late else "splade" if self.sparse else None
        if expected is not None and self.pooling != expected:
            raise ValueError(f"pooling: {self.pooling!r}, expected {expected!r}")
        if expected is None and self.pooling not in POOLINGS:
            raise ValueError(f"pooling: {self.pooling!r} not in {POOLINGS}")
        if self.dimension < 1:
            raise ValueError(f"dimension: must be >= 1, got {self.dimension}")
        if self.matryoshka and not all(1 <= d <= self.dimension for d in self.matryoshka):
            raise ValueError(
                f"matryoshka_dimensions: {list(self.matryoshka)} must be within "
                f"1..{self.dimension} (the model's dimension)"
            )

    @property
    def output(self) -> str:
        """What its EmbedWork asks for (``OUTPUTS``)."""
        if self.hybrid is not None:
            return "hybrid"
        return "tokens" if self.late else "sparse" if self.sparse else "vector"

    def prompt(self, name: str) -> str | None:
        """The text of the prompt called ``name`` (None: the model has no such prompt)."""
        return dict(self.prompts).get(name)


@dataclass(frozen=True)
class EmbedWork:
    """Embeddings (semantics 20) in token space: one float32 vector per input, pooled as the
    model's PoolingHead says, before any Matryoshka cut (the ingress does that). The first
    ``prompt_lengths[i]`` tokens of input i are its prompt (pooled only with
    ``include_prompt``); () means none has one. On a cross-encoder each input is a pair
    and its tokens from ``second_starts[i]`` on have token type 1 (the document).

    ``output`` (``OUTPUTS``): ``tokens`` answers every token's vector per input
    (``TokenVectors``), ``sparse`` one sparse vector per input (``SparseVectors``), as the
    model's ``late`` and ``sparse`` say; ``query_only[i]``: input i's last that many tokens
    read the input but no token reads them (a late-interaction query's fill tokens)."""

    inputs: tuple[tuple[int, ...], ...]
    prompt_lengths: tuple[int, ...] = ()
    deadline: float | None = None
    adapter: str | None = None  # a LoRA adapter's name (semantics 21); None: the base model
    second_starts: tuple[int, ...] = ()  # a pair's second text's first token; (): none
    # False: vectors before the model's L2 normalization (Dense applied), for the ingress to
    # fold chunks of one long input into one vector first (app.embed_chunks)
    normalize: bool = True
    output: str = "vector"
    query_only: tuple[int, ...] = ()
    # Inputs of concurrent requests share rows and steps: an idle replica waits
    # ``pack_wait_s`` for them (replicas.serving.deployment)
    packs_across_requests: ClassVar[bool] = True
    answer: ClassVar[type[Vectors]] = Vectors  # output "vector"; answered() for all
    noun: ClassVar[str] = "inputs"

    def answered(self, value: Any) -> Any:
        """``value`` as this work's answer type (its ``output``'s)."""
        return ANSWERS[self.output].of(value)

    @property
    def num_items(self) -> int:
        return len(self.inputs)

    def computed_tokens(self, multi_item: bool) -> int:
        return sum(len(tokens) for tokens in self.inputs)

    def check_rows(self, limits: Any, multi_item: bool, max_input: int | None) -> None:
        """Each input within the model's ``max_input`` and the longest row a step holds
        (``limits``: a ScoringLimits, check_limits)."""
        longest = max((len(tokens) for tokens in self.inputs), default=0)
        limit = min(limits.max_row_tokens, max_input or limits.max_row_tokens)
        if longest > limit:
            raise ScoringError(
                Reason.SEQUENCE_TOO_LONG,
                f"an input of {longest} tokens exceeds the model's limit of {limit} tokens "
                "(truncate_prompt_tokens keeps the first k)",
            )

    def tokens_held(self, tokens: int, multi_item: bool) -> str:
        return f"the inputs hold {tokens} tokens"

    def empty_answer(self, vector_width: int) -> Any:
        """``vector_width``: the model's (its vectors' dimension, a cross-encoder's labels)."""
        return ANSWERS[self.output].empty(self.num_items, vector_width)

    def second_start(self, i: int) -> int:
        """Where input i's token type 1 starts (its length: nowhere)."""
        return self.second_starts[i] if self.second_starts else len(self.inputs[i])

    def prompt_length(self, i: int) -> int:
        return self.prompt_lengths[i] if self.prompt_lengths else 0

    def query_only_tokens(self, i: int) -> int:
        return self.query_only[i] if self.query_only else 0


def l2_normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row of ``vectors [N, D]`` over its L2 norm, float32 (torch's ``normalize``)."""
    out = np.asarray(vectors, np.float32)
    norms = np.sqrt(np.sum(out * out, axis=-1, keepdims=True, dtype=np.float32))
    return (out / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
