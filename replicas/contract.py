"""The narrow contract between the CPU ingress and the scoring replicas.

Jax-free on purpose: the ingress (``app/``) imports this module, and nothing here may pull in
jax. Token ids only cross this boundary; text never reaches a replica.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from replicas.answers import LabelScores, PromptScores, Vectors
from replicas.embed_contract import EmbedWork, PoolingHead  # the embedding half
from replicas.errors import Reason, ScoringError
from replicas.kinds import ModelKind, recognize

DEFAULT_MAX_ITEMS_PER_REQUEST = 128
DEFAULT_MAX_MULTI_ITEM_SEQ_LEN = 8192


@dataclass(frozen=True)
class ScoreWork:
    """One scoring request in token space.

    The score row of item i is the next-token log-probability of each label after
    ``query_ids + item_ids[i]`` (``item_ids[i] + query_ids`` when ``item_first``); on a model
    with a ScoreHead, ``label_ids`` index the head's outputs at that row's last token.
    """

    query_ids: tuple[int, ...]
    item_ids: tuple[tuple[int, ...], ...]
    label_ids: tuple[int, ...]
    item_first: bool = False
    # Wall-clock time (time.time()) after which nobody waits for the answer: the replica
    # drops the work instead of scoring it (semantics 12). None: no deadline.
    deadline: float | None = None
    adapter: str | None = None  # a LoRA adapter's name (semantics 21); None: the base model
    packs_across_requests: ClassVar[bool] = False  # batch_wait_timeout_s gathers these
    answer: ClassVar[type[LabelScores]] = LabelScores
    noun: ClassVar[str] = "items"

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    def empty_answer(self, vector_width: int) -> LabelScores:
        return LabelScores.empty(self.num_items, len(self.label_ids))

    def computed_tokens(self, multi_item: bool) -> int:
        """The query once when its items share it as a prefix, else once per item row, plus
        every item."""
        items = sum(len(item) for item in self.item_ids)
        if multi_item and not self.item_first:
            return len(self.query_ids) + items
        return items + len(self.query_ids) * self.num_items

    def check_rows(self, limits: ScoringLimits, multi_item: bool, max_input: int | None) -> None:
        """The packed sequence, each row and the warm envelopes (check_limits)."""
        item_lens = [len(item) for item in self.item_ids]
        shared = multi_item and not self.item_first
        query = len(self.query_ids)
        length = packed_length(query, item_lens) if shared else longest_row(query, item_lens)
        if length > limits.max_multi_item_seq_len:
            raise ScoringError(
                Reason.SEQUENCE_TOO_LONG,
                f"sequence length {length} exceeds max_multi_item_seq_len="
                f"{limits.max_multi_item_seq_len}",
            )
        row = max([query, *item_lens]) if shared else length
        if row > limits.max_row_tokens:
            what = "query or item" if shared else "query + item row"
            raise ScoringError(
                Reason.SEQUENCE_TOO_LONG,
                f"a {what} of {row} tokens exceeds the longest row a step holds "
                f"({limits.max_row_tokens} tokens)",
            )
        _check_envelopes(self, limits.envelopes, shared)

    def tokens_held(self, tokens: int, multi_item: bool) -> str:
        shared = multi_item and not self.item_first
        how = "" if shared else " (without a shared prefix the query counts once per item)"
        return f"the request needs {tokens} tokens computed{how}"


MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class PromptWork:
    """Prompt log-likelihood (semantics 14) in token space: for each prompt, the
    log-probability of every token after the first given the tokens before it, the
    ``top_k`` most likely tokens at every position, and the greedy next token after the
    whole prompt (its top alternatives, at least one). Prompts of one work that share a
    prefix compute it once; a prefix in the query cache is not computed at all
    (semantics 15)."""

    prompts: tuple[tuple[int, ...], ...]
    top_k: int = 0
    deadline: float | None = None
    # False: a prompt that shares no whole block with another prompt of this work runs whole,
    # packed with the other such prompts into item-stream rows (many per step), and nothing
    # of it is kept for later requests. True: its whole blocks run as a prefix of its own,
    # kept in the query cache (lm-eval sends one question's choices in different requests).
    keep_lone_prefixes: bool = True
    # Score only each prompt's last ``scored_tail`` tokens in item-stream steps (rerank's
    # query tokens): the LM head skips the others, whose log-probs and top-k are then NaN /
    # -1 unless a prefix step computed them. None: every token, and the next one.
    scored_tail: int | None = None
    adapter: str | None = None  # a LoRA adapter's name (semantics 21); None: the base model
    packs_across_requests: ClassVar[bool] = False
    answer: ClassVar[type[PromptScores]] = PromptScores
    noun: ClassVar[str] = "prompts"

    @property
    def num_items(self) -> int:
        return len(self.prompts)

    def empty_answer(self, vector_width: int) -> PromptScores:
        return PromptScores()

    def computed_tokens(self, multi_item: bool) -> int:
        """Every prompt token: the most a shared or cached prefix leaves to compute."""
        return sum(len(prompt) for prompt in self.prompts)

    def check_rows(self, limits: ScoringLimits, multi_item: bool, max_input: int | None) -> None:
        """Each prompt within the longest row a step holds (and the warm prompts')."""
        longest = max((len(prompt) for prompt in self.prompts), default=0)
        if longest > limits.max_row_tokens:
            raise ScoringError(
                Reason.SEQUENCE_TOO_LONG,
                f"a prompt of {longest} tokens exceeds the longest row a step holds "
                f"({limits.max_row_tokens} tokens)",
            )
        if limits.max_prompt_tokens is not None and longest > limits.max_prompt_tokens:
            raise ScoringError(
                Reason.SEQUENCE_TOO_LONG,
                f"a prompt of {longest} tokens is beyond what this deployment serves without a "
                f"compile (completion_warmup_shapes: prompts <= {limits.max_prompt_tokens} "
                "tokens)",
            )

    def tokens_held(self, tokens: int, multi_item: bool) -> str:
        return f"the prompts hold {tokens} tokens"


@dataclass(frozen=True)
class PromptLogprobs:
    """One prompt's answer. For a prompt of L tokens: ``token_logprobs [L]`` float32 (entry
    j: log P(token j | tokens < j); entry 0 is NaN, nothing precedes it); ``top_ids``,
    ``top_logprobs [L + 1, k]`` (row j: the k most likely tokens after tokens < j, best
    first; row 0 unused, -1 / NaN; row L: after the whole prompt, the greedy next token
    first). ``k = max(top_k, 1)``."""

    token_logprobs: Any
    top_ids: Any
    top_logprobs: Any


@dataclass(frozen=True)
class ScoredWork:
    """A replica's answer to one ScoreWork: log-probabilities ``[n_items, n_labels]``
    (float32; a head model's head outputs) and the seconds of the engine step that scored
    them (shared with the other requests batched into that step; several steps add up).
    ``clean``: no compile ran beside or inside that step, so its time says how fast the
    engine drains work (admission's work rate counts only clean answers, semantics 16)."""

    scores: LabelScores | PromptScores | Vectors  # the work's ``answer`` type
    inference_s: float
    clean: bool = True


@dataclass(frozen=True)
class Envelope:
    """A warm-up shape's reach: requests whose query, every item and label count are within
    it run on signatures compiled at start-up (a single-item row ``query + item`` within
    ``query_tokens + item_tokens``)."""

    query_tokens: int
    item_tokens: int
    labels: int

    def admits(self, query: int, longest_item: int, labels: int, shared: bool) -> bool:
        if labels > self.labels:
            return False
        if shared:
            return query <= self.query_tokens and longest_item <= self.item_tokens
        return query + longest_item <= self.query_tokens + self.item_tokens

    def describe(self, shared: bool) -> str:
        if shared:
            return f"queries <= {self.query_tokens} tokens with items <= {self.item_tokens}"
        return f"query + item rows <= {self.query_tokens + self.item_tokens} tokens"


@dataclass(frozen=True)
class ScoringLimits:
    """Request limits shared by the ingress and the replica (400s, ``check_model_limits``)."""

    max_items_per_request: int = DEFAULT_MAX_ITEMS_PER_REQUEST
    max_multi_item_seq_len: int = DEFAULT_MAX_MULTI_ITEM_SEQ_LEN
    # The longest query, item or single-item row one step holds.
    max_row_tokens: int = DEFAULT_MAX_MULTI_ITEM_SEQ_LEN
    # With ``limit_to_warmup``: a request must fit one of these (warmup_shapes), so it never
    # waits for a compile. Empty: no such limit (uncovered shapes compile on the request path).
    envelopes: tuple[Envelope, ...] = ()
    # The most tokens one request may ask a replica to compute (``computed_tokens``); None:
    # no bound. Keeps the largest valid request within the proxy's timeout.
    max_request_tokens: int | None = None
    # With ``limit_to_warmup`` and ``completion_warmup_shapes``: the longest prompt warm-up
    # covers (prefix_tokens + tokens_after); None: max_row_tokens.
    max_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_items_per_request < 1:
            raise ValueError(
                f"max_items_per_request must be >= 1, got {self.max_items_per_request}"
            )
        if self.max_multi_item_seq_len < 2:
            raise ValueError(
                f"max_multi_item_seq_len must be >= 2, got {self.max_multi_item_seq_len}"
            )


HEAD_KINDS = ("linear", "reward_mlp", "cross_encoder")
HEAD_ACTIVATIONS = ("sigmoid", "identity")  # what a cross-encoder applies to its logits
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


@dataclass(frozen=True)
class ScoreHead:
    """A sequence-classification or reward head on the decoder's final hidden state
    (semantics 18). A head model's ScoreWork asks for ``label_ids = range(num_labels)`` and
    its score row holds the head's float32 outputs (logits) in that order, read at the
    item's (or row's) last token, in place of label log-probabilities.

    ``linear``: ``*ForSequenceClassification``'s bias-free ``score`` [D -> num_labels];
    ``reward_mlp``: ``Qwen2ForRewardModel``'s D -> D, ReLU, D -> 1 (with biases);
    ``cross_encoder``: an encoder's (``BertForSequenceClassification``) pooler (D -> D, tanh)
    and classifier (D -> num_labels) on the [CLS] token of a (query, document) pair, which
    runs as an EmbedWork; ``activation``: what ``CrossEncoder.predict`` applies to the
    logits, ``max_length``: the most tokens of a pair (its position embeddings).
    ModernBERT's cross-encoder (``ModernBertForSequenceClassification``): ``norm_eps`` set,
    its head is dense, GELU, LayerNorm (that eps) then the classifier, on the pair's [CLS]
    token or its tokens' mean (``pooling``: its ``classifier_pooling``)."""

    kind: str
    num_labels: int
    id2label: tuple[str, ...]
    problem_type: str | None = None
    activation: str | None = None
    max_length: int | None = None
    pooling: str = "cls"
    norm_eps: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head kind {self.kind!r} not in {HEAD_KINDS}")
        if self.num_labels < 1 or len(self.id2label) != self.num_labels:
            raise ValueError(f"num_labels: {self.num_labels} with id2label {self.id2label}")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type: {self.problem_type!r} not in {PROBLEM_TYPES}")
        if self.activation is not None and self.activation not in HEAD_ACTIVATIONS:
            raise ValueError(f"activation: {self.activation!r} not in {HEAD_ACTIVATIONS}")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling: {self.pooling!r} not in ('cls', 'mean')")

    @property
    def label_ids(self) -> tuple[int, ...]:
        """What a head model's ScoreWork asks for: every output, in order."""
        return tuple(range(self.num_labels))


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress needs to know about the model a replica serves."""

    name: str
    vocab_size: int
    multi_item_scoring_delimiter: int | None
    limits: ScoringLimits
    head: ScoreHead | None = None  # None: a causal LM scored by label tokens
    pooling: PoolingHead | None = None  # set: an embedding model (no LM head, no score head)
    adapters: Collection[str] = ()  # LoRA adapters a request may name as its ``model``

    @property
    def model_kind(self) -> ModelKind:
        """What the model is (replicas.kinds), recognized from its head and pooling."""
        return recognize(self.head, self.pooling)

    @property
    def kind(self) -> str:
        """The kind's name, what /v1/models reports."""
        return self.model_kind.name

    @property
    def max_input_tokens(self) -> int | None:
        """The most tokens one EmbedWork input may hold: an embedding model's
        ``max_seq_length``, a cross-encoder's pair's ``max_length``; None: no bound of its own."""
        pooling = self.pooling.max_seq_length if self.pooling else None
        return pooling or (self.head.max_length if self.head else None)


def packed_length(query_len: int, item_lens: Sequence[int]) -> int:
    """Length of RFC-008's packed multi-item sequence ``query<d>item1<d>...itemN<d>``.

    This is the length that ``max_multi_item_seq_len`` bounds, whatever layout computes it.
    """
    return query_len + 1 + sum(length + 1 for length in item_lens)


def longest_row(query_len: int, item_lens: Sequence[int]) -> int:
    """Length of the longest single-item row ``query + item``."""
    return query_len + max(item_lens, default=0)


CALL_OVERHEAD_TOKENS = 32  # a call's fixed cost (routing, a batch slot, unpacking), in tokens


def computed_tokens(work: ScoreWork | PromptWork | EmbedWork, multi_item: bool) -> int:
    """The tokens a replica computes for ``work`` (each work's own count)."""
    return work.computed_tokens(multi_item)


def work_cost(work: ScoreWork | PromptWork | EmbedWork, multi_item: bool) -> int:
    """What admission counts for ``work`` (semantics 16): its computed tokens plus a call's
    fixed cost."""
    return CALL_OVERHEAD_TOKENS + work.computed_tokens(multi_item)


def check_limits(
    work: ScoreWork | PromptWork | EmbedWork,
    limits: ScoringLimits,
    multi_item: bool,
    max_input_tokens: int | None = None,
) -> None:
    """Raise ScoringError if ``work`` breaks ``limits``; used on both sides of the handle:
    its items (prompts, inputs) per request, its rows (the work's own rule,
    ``check_rows``), the tokens it needs computed. ``max_input_tokens``: the model's bound
    on one EmbedWork input (``ModelInfo.max_input_tokens``)."""
    if work.num_items > limits.max_items_per_request:
        raise ScoringError(
            Reason.TOO_MANY_ITEMS,
            f"{work.num_items} {work.noun} exceed max_items_per_request="
            f"{limits.max_items_per_request}",
        )
    work.check_rows(limits, multi_item, max_input_tokens)
    tokens = work.computed_tokens(multi_item)
    if limits.max_request_tokens is not None and tokens > limits.max_request_tokens:
        raise ScoringError(
            Reason.TOO_MANY_TOKENS,
            f"{work.tokens_held(tokens, multi_item)}, over max_request_tokens="
            f"{limits.max_request_tokens}",
        )


def check_embed_limits(work: EmbedWork, limits: ScoringLimits, max_seq_length: int | None) -> None:
    """``check_limits`` of an EmbedWork, each input within ``max_seq_length`` too."""
    check_limits(work, limits, True, max_seq_length)


def check_model_limits(work: ScoreWork | PromptWork | EmbedWork, info: ModelInfo) -> None:
    """``check_limits`` as a replica runs it (and a batch job before its engine, which trusts
    both): multi-item when the model has a delimiter, an input within its
    ``max_input_tokens``."""
    multi_item = info.multi_item_scoring_delimiter is not None
    check_limits(work, info.limits, multi_item, info.max_input_tokens)


def _check_envelopes(work: ScoreWork, envelopes: Sequence[Envelope], shared: bool) -> None:
    """Work that no warm envelope admits would wait for a compile: refuse it instead."""
    query, labels = len(work.query_ids), len(work.label_ids)
    longest = max((len(item) for item in work.item_ids), default=0)
    if not envelopes or any(e.admits(query, longest, labels, shared) for e in envelopes):
        return
    most_labels = max(e.labels for e in envelopes)
    if labels > most_labels:
        raise ScoringError(
            Reason.TOO_MANY_LABELS,
            f"{labels} label_token_ids exceed the {most_labels} this deployment serves "
            "(warmup_shapes)",
        )
    served = "; ".join(dict.fromkeys(e.describe(shared) for e in envelopes))
    what = f"a {query}-token query with items up to {longest} tokens"
    if not shared:
        what = f"a query + item row of {query + longest} tokens"
    raise ScoringError(
        Reason.SEQUENCE_TOO_LONG,
        f"{what} is beyond what this deployment serves without a compile (warmup_shapes: {served})",
    )
