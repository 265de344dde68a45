"""The batching and admission section (how a replica groups requests into engine calls and
sheds overload) and the HTTP and access section (what one request may ask, /v1/rerank's
method, API keys). Jax-free."""

from __future__ import annotations

from dataclasses import dataclass

from replicas.contract import DEFAULT_MAX_ITEMS_PER_REQUEST, DEFAULT_MAX_MULTI_ITEM_SEQ_LEN
from replicas.settings.common import SettingsError, check_at_least, check_choice

RERANK_METHODS = ("yes_no", "query_likelihood", "head")
CHUNK_AGGREGATIONS = ("max", "mean")
MAX_ITEMS_PER_REQUEST = 4096


@dataclass(frozen=True)
class BatchingSettings:
    """Cross-request batching, merged engine calls, admission control and deadlines."""

    max_batch_size: int = 16
    """Requests one ``@serve.batch`` call takes at most (reconfigurable in user_config)."""
    batch_wait_timeout_s: float = 0.005
    """How long a batch waits to fill (reconfigurable in user_config)."""
    pack_wait_s: float = 0.0
    """How long an idle replica's first engine call waits for other requests' works when
    its works pack with them (``packs_across_requests``: embedding inputs share rows and
    steps), unless ``max_batch_size`` works are already waiting; other works start at
    once. 0: no wait."""
    max_call_s: float = 0.0
    """Seconds one engine call is expected to take at most when batches that waited during
    a step are merged into it (the first batch always runs): its works' cost (tokens to
    compute plus a call's fixed cost) over the replica's recent work rate, admission's
    (``replicas.serving.merging.call_budget``); until the replica has a rate, no batch
    joins. 0: only max_batch_size bounds a call. Bounds how long an admitted request waits
    behind a merged call under overload, whatever the model's cost per token."""
    max_queue_wait_s: float = 5.0
    """Admission control (semantics 12): a request whose expected wait (Little's law over
    recent completions, at the ingress and at the replica) exceeds this is answered at once
    with 503 overloaded and Retry-After; 0 turns it off."""
    request_deadline_s: float = 280.0
    """Each request's deadline: work still unscored this long after the ingress took it is
    dropped (503 overloaded); keep it below the proxy's http_options.request_timeout_s."""

    def __post_init__(self) -> None:
        check_at_least("max_call_s", self.max_call_s, 0, " (0 = unbounded)")
        check_at_least("max_queue_wait_s", self.max_queue_wait_s, 0)
        if self.request_deadline_s <= 0:
            raise SettingsError(f"request_deadline_s: must be > 0, got {self.request_deadline_s}")
        check_at_least("max_batch_size", self.max_batch_size, 1)
        check_at_least("pack_wait_s", self.pack_wait_s, 0)
        check_at_least("batch_wait_timeout_s", self.batch_wait_timeout_s, 0)


@dataclass(frozen=True)
class HttpSettings:
    """What the ingress accepts of one request, how /v1/rerank scores, and who may call."""

    max_items_per_request: int = DEFAULT_MAX_ITEMS_PER_REQUEST
    """Items (documents, choices) one request may hold, up to 4096."""
    max_multi_item_seq_len: int = DEFAULT_MAX_MULTI_ITEM_SEQ_LEN
    """Query + all items + delimiters (RFC-008's packed length) of a multi-item request."""
    max_request_tokens: int | None = None
    """The most tokens one request may ask a replica to compute (the query once plus its
    items when they share it, else query + item per item); None: no bound."""
    rerank_method: str = "yes_no"
    """/v1/rerank (app/rerank.py): yes_no (a reranker's P(yes) after query and document, as
    Qwen3-Reranker) or query_likelihood (the query's mean token log-prob after the document,
    for general language models; docs/serving.md measures both) or head (sigmoid of a
    one-label score head after query and document, a seq-cls reranker)."""
    rerank_template: tuple[tuple[str, str], ...] = ()
    """The method's prompt parts: yes_no {query, document, yes, no, instruction}, unset
    Qwen3-Reranker's; query_likelihood {document, query}, unset "{document}\\nQuestion:" then
    " {query}" (measured best of four on SmolLM2, docs/serving.md)."""
    max_chunks_per_doc: int = 1
    """/v1/rerank's default for Cohere v1's ``max_chunks_per_doc``: a document longer than
    ``chunk_tokens`` (after ``max_tokens_per_doc``) is cut into at most this many chunks,
    each an item behind the query, and ranks by its chunks' scores; 1: chunking off (a
    request may still ask)."""
    chunk_tokens: int = 512
    """The default chunk size in document tokens (Cohere v1's chunks are ~500)."""
    chunk_overlap: int = 0
    """Tokens a chunk repeats of the one before it, in [0, chunk_tokens)."""
    chunk_aggregation: str = "max"
    """A chunked document's relevance: its best chunk's (max) or the chunks' mean."""
    embedding_calibration: str | None = None
    """int8/uint8 embedding types (app.embed_types): a safetensors file whose ``embeddings``
    tensor [N, D] holds the model's vectors of representative texts; each dimension's range
    is their min and max (sentence-transformers' calibration_embeddings). None: [-1, 1],
    the bounds of a normalized vector's components."""
    api_keys_env: str | None = None
    """API keys (semantics 13), never in the config: the name of an environment variable
    holding them (comma/space/line separated); none of the two set = no auth."""
    api_keys_file: str | None = None
    """... and/or a file holding them."""

    def __post_init__(self) -> None:
        check_choice("rerank_method", self.rerank_method, RERANK_METHODS)
        check_choice("chunk_aggregation", self.chunk_aggregation, CHUNK_AGGREGATIONS)
        check_at_least("max_chunks_per_doc", self.max_chunks_per_doc, 1, " (1 = chunking off)")
        check_at_least("chunk_tokens", self.chunk_tokens, 1)
        if not 0 <= self.chunk_overlap < self.chunk_tokens:
            raise SettingsError(
                f"chunk_overlap: must be in [0, chunk_tokens={self.chunk_tokens}), "
                f"got {self.chunk_overlap}"
            )
        if not 1 <= self.max_items_per_request <= MAX_ITEMS_PER_REQUEST:
            raise SettingsError(
                f"max_items_per_request: must be in [1, {MAX_ITEMS_PER_REQUEST}], "
                f"got {self.max_items_per_request}"
            )
        if self.max_request_tokens is not None:
            check_at_least("max_request_tokens", self.max_request_tokens, 1, " (or null)")
