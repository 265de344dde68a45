"""``python -m batch embed``: each row's /v1/embeddings vector on an embedding model
(semantics 20) in an ``embedding`` column (a fixed-size list of float32), with ``error`` and
``error_message`` as the other modes write them, on the stage skeleton (batch.stages).

``EmbedPrepare`` (CPU actor): the row's text prepared by the route's own code
(``app.embeddings.Embedder``: the prompt in front, the model's length limit), or the route's
400. ``EmbedEngine`` (one engine per actor) or ``ServeEmbed`` (``--engine serve``: the
ingress's ``score_work`` through its handle): the batch's rows packed by length into
EmbedWorks within the request limits, so every engine call runs full rows of inputs end to
end, then each row's vector (Matryoshka ``--dimensions`` applied) and with
``--embedding-types`` one ``embedding_<type>`` column per type, as /v2/embed's
``embedding_types`` answers (``app.embed_types``; the stages' payload, ``EmbedOutput``, made
by ``embed_output``, which checks it against the model). ``finish_embed`` tallies the rows
and drops the helper columns.

On a late-interaction, sparse or hybrid model (``ModelKind.output`` ``tokens``, ``sparse``
or ``hybrid``) the row is prepared as /pooling or /embed_sparse prepares it, in the job's
``--input-type`` role, and answered in that output's columns (batch.retrieval):
``embedding`` (the scored token vectors), or ``sparse_indices`` and ``sparse_values``, or a
hybrid model's ``--outputs`` from its one pass (``embedding``, ``token_embeddings``, the
sparse columns).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from app.embed_chunks import Chunking, chunk_weights
from app.embed_types import NO_CALIBRATION, Calibration, load_calibration, typed_embeddings
from app.embeddings import check_dimensions, matryoshka
from batch.retrieval import PARTS, Retrieval, input_vectors, retrieval_of, row_columns, text_work
from batch.rows import plain
from batch.serve_stage import ServeStage
from batch.stages import EngineStage, PrepareRows, finish_rows, with_columns
from replicas.contract import EmbedWork, PoolingHead, ScoringLimits
from replicas.errors import Reason, ScoringError
from replicas.settings import ReplicaSettings, SettingsError

IDS, SKIP, CHUNKS = "_sj_embed_ids", "_sj_embed_skip", "_sj_embed_chunks"
FILL = "_sj_embed_fill"  # a late-interaction query's query-only fill tokens
HELPERS = (IDS, SKIP, CHUNKS, FILL)


@dataclass(frozen=True)
class EmbedColumns:
    input: str = "text"
    id: str = "id"
    prompt_name: str | None = None
    dimensions: int | None = None
    types: tuple[str, ...] = ()
    """``--embedding-types``: each one's own ``embedding_<type>`` column."""
    truncate: str | None = None
    """``--truncate``: /v1/embeddings' ``truncate`` (NONE, START, END, CHUNK; None: NONE)."""
    input_type: str | None = None
    """``--input-type``: a late-interaction or sparse model's role (query, document; None:
    document)."""
    parts: tuple[str, ...] | None = None
    """``--outputs``: a hybrid model's parts (``batch.retrieval.PARTS``; None: all)."""

    @property
    def outputs(self) -> tuple[str, ...]:
        """The result columns: ``embedding``, then one per type."""
        return ("embedding", *(f"embedding_{kind}" for kind in self.types))


@dataclass(frozen=True, eq=False)
class EmbedOutput:
    """What the engine stages make of each row's vector."""

    dimensions: int | None = None
    """Matryoshka: the first ``dimensions`` components, normalized (None: all)."""
    types: tuple[str, ...] = ()
    """Embedding types written beside ``embedding``."""
    calibration: Calibration = NO_CALIBRATION
    """int8/uint8 ranges: the config's ``embedding_calibration``."""
    chunked: bool = False
    """``--truncate CHUNK``: a row's chunks folded into its vector (app.embed_chunks)."""
    retrieval: Retrieval | None = None
    """A late-interaction or sparse model's (batch.retrieval); None: a dense vector each."""
    role: str = "document"
    """``--input-type``: the texts' role (late interaction: which tokens are scored)."""
    parts: tuple[str, ...] = tuple(PARTS)
    """``--outputs``: the parts of a hybrid model's answer written."""

    @property
    def outputs(self) -> tuple[str, ...]:
        """The result columns: ``embedding`` and one per type, or the kind's own."""
        if self.retrieval is not None:
            return self.retrieval.columns_of(self.parts)
        return ("embedding", *(f"embedding_{kind}" for kind in self.types))

    @property
    def output(self) -> str:
        """What its EmbedWorks ask for (``replicas.embed_contract.OUTPUTS``)."""
        return "vector" if self.retrieval is None else self.retrieval.output


class EmbedPrepare(PrepareRows):
    """The route's tokenizer and prompts per CPU actor (``PrepareRows``'s service and
    columns; its own ``prepare`` and call)."""

    def prepare(self, row: dict[str, Any]) -> EmbedWork | ScoringError:
        text = plain(row.get(self._columns.input))
        if not isinstance(text, str):
            return ScoringError(Reason.INVALID_REQUEST, "input: one text per row", "input")
        payload: dict[str, Any] = {"input": text}
        if self._columns.prompt_name is not None:
            payload["prompt_name"] = self._columns.prompt_name
        if self._columns.truncate is not None:
            payload["truncate"] = self._columns.truncate
        try:
            if not self._service.info.model_kind.vectors:  # /pooling or /embed_sparse
                role, truncate = self._columns.input_type or "document", self._columns.truncate
                name = self._columns.prompt_name
                return text_work(self._service, text, role, name, truncate == "END")
            return self._service.embedder.prepare(payload).work
        except ScoringError as error:
            return error

    def helper_columns(self, prepared: list[Any]) -> dict[str, pa.Array]:
        works: list[EmbedWork | None] = prepared
        ids = [[t for chunk in w.inputs for t in chunk] if w else None for w in works]
        return {
            IDS: pa.array(ids, pa.list_(pa.int32())),
            SKIP: pa.array([w.prompt_length(0) if w else None for w in works], pa.int32()),
            CHUNKS: pa.array(
                [[len(c) for c in w.inputs] if w else None for w in works], pa.list_(pa.int32())
            ),
            FILL: pa.array([w.query_only_tokens(0) if w else None for w in works], pa.int32()),
        }


@dataclass(frozen=True)
class Pack:
    """One engine call's EmbedWork and its ``rows``; ``chunks[k]``: how many of its inputs
    row k's are (1 unless ``--truncate CHUNK`` cut it)."""

    work: EmbedWork
    rows: list[int]
    chunks: list[int]


def pack_rows(
    batch: pa.Table, limits: ScoringLimits, adapter: str | None = None, chunked: bool = False,
    output: str = "vector",
) -> list[Pack]:  # fmt: skip
    """The batch's prepared rows, longest first, in EmbedWorks of at most
    ``max_items_per_request`` inputs (a row's chunks each count) and ``max_request_tokens``
    tokens, each run with ``adapter`` (``--model``; None: the base), not normalized when
    ``chunked`` (the rows' chunks are folded first), asking for ``output``."""
    ids, skips = batch.column(IDS).to_pylist(), batch.column(SKIP).to_pylist()
    chunks = batch.column(CHUNKS).to_pylist()
    fills = batch.column(FILL).to_pylist() if FILL in batch.column_names else [0] * len(ids)
    shape = Shape(adapter, chunked, output)
    rows = sorted((r for r, i in enumerate(ids) if i is not None), key=lambda r: -len(ids[r]))
    packs: list[Pack] = []
    current: list[int] = []
    tokens = items = 0
    budget = limits.max_request_tokens or 1 << 62
    for row in rows:
        length, count = len(ids[row]), len(chunks[row])
        full = items + count > limits.max_items_per_request or tokens + length > budget
        if current and full:
            packs.append(_pack(ids, skips, chunks, fills, current, shape))
            current, tokens, items = [], 0, 0
        current.append(row)
        tokens += length
        items += count
    if current:
        packs.append(_pack(ids, skips, chunks, fills, current, shape))
    return packs


@dataclass(frozen=True)
class Shape:
    """What every EmbedWork of a job runs with and asks for."""

    adapter: str | None
    chunked: bool
    output: str


def _pack(
    ids: list[Any], skips: list[Any], chunks: list[Any], fills: list[Any], rows: list[int],
    shape: Shape,
) -> Pack:  # fmt: skip
    inputs: list[tuple[int, ...]] = []
    lengths: list[int] = []
    query_only: list[int] = []
    for r in rows:
        cuts = np.cumsum([0, *chunks[r]])
        inputs += [tuple(ids[r][lo:hi]) for lo, hi in itertools.pairwise(cuts)]
        lengths += [int(skips[r] or 0)] + [0] * (len(chunks[r]) - 1)
        query_only += [int(fills[r] or 0)] + [0] * (len(chunks[r]) - 1)
    prompts = tuple(lengths) if any(lengths) else ()
    work = EmbedWork(
        tuple(inputs), prompts, adapter=shape.adapter, normalize=not shape.chunked,
        output=shape.output, query_only=tuple(query_only) if any(query_only) else (),
    )  # fmt: skip
    return Pack(work, rows, [len(chunks[r]) for r in rows])


def row_vectors(pack: Pack, answer: Any, head: PoolingHead, chunked: bool) -> np.ndarray:
    """A pack's answer ``[inputs, D]`` -> one vector per row ``[rows, D]``: each row's chunks
    folded as the route folds them (``app.embed_chunks.Chunking``) when ``chunked``."""
    if not chunked:
        return np.asarray(answer, np.float32)
    starts = [0, *itertools.accumulate(pack.chunks)]
    weights: list[int] = []
    for lo, hi in itertools.pairwise(starts):
        lengths = [len(ids) for ids in pack.work.inputs[lo:hi]]
        weights += chunk_weights(lengths, pack.work.prompt_length(lo))
    return Chunking(tuple(starts), tuple(weights), head.pooling, head.normalize).fold(answer)


def vectors_of(
    rows: int, packs: Sequence[Pack], answers: Sequence[Any], head: PoolingHead,
    output: EmbedOutput,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each row's vector ``[rows, d]`` float32 (Matryoshka-cut) and which rows have one."""
    values = np.zeros((rows, output.dimensions or head.dimension), np.float32)
    valid = np.zeros(rows, bool)
    for pack, answer in zip(packs, answers, strict=True):
        vectors = row_vectors(pack, answer, head, output.chunked)
        values[pack.rows] = matryoshka(vectors, output.dimensions)
        valid[pack.rows] = True
    return values, valid


def output_columns(values: np.ndarray, valid: np.ndarray, output: EmbedOutput) -> dict[str, Any]:
    """``embedding`` (a fixed-size list of float32) and one column per embedding type, as
    /v2/embed answers them; null on a refused row."""
    width = values.shape[1]
    flat = pa.array(values.reshape(-1), pa.float32())
    array = pa.FixedSizeListArray.from_arrays(flat, width).to_pylist()
    columns: dict[str, Any] = {
        "embedding": pa.array(
            [v if ok else None for v, ok in zip(array, valid, strict=True)],
            pa.list_(pa.float32(), width),
        )
    }
    typed = typed_embeddings(values, output.types, output.calibration, output.dimensions)
    for kind, answers in typed.items():
        columns[f"embedding_{kind}"] = pa.array(
            [a if ok else None for a, ok in zip(answers, valid, strict=True)], TYPE_ARROW[kind]
        )
    return columns


TYPE_ARROW = {
    "float": pa.list_(pa.float32()),
    "int8": pa.list_(pa.int8()),
    "uint8": pa.list_(pa.uint8()),
    "binary": pa.list_(pa.int8()),
    "ubinary": pa.list_(pa.uint8()),
    "base64": pa.string(),
}


class EmbedEngine(EngineStage):
    """The engine stage of ``embed`` (payload: an ``EmbedOutput``)."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        info = self._engine.info
        packs = pack_rows(batch, info.limits, self._adapter, *shape_of(self._payload))
        answers = self.call([pack.work for pack in packs])
        return with_columns(batch, answer_columns(batch, packs, answers, info, self._payload))


class ServeEmbed(ServeStage):
    """``--engine serve``: each pack to the ingress's ``score_work`` (checked again there),
    within the limits the app describes; 503s sent again after Retry-After."""

    def __init__(
        self,
        app_name: str,
        settings: ReplicaSettings,
        output: EmbedOutput,
        tally: Any,
        max_in_flight: int = 4,
        adapter: str | None = None,
    ) -> None:
        super().__init__(app_name, settings, output, tally, max_in_flight, adapter)
        self._info = self._handle.describe.remote().result()

    def __call__(self, batch: pa.Table) -> pa.Table:
        packs = pack_rows(batch, self._info.limits, self._adapter, *shape_of(self._payload))
        answers = self.send_all(self._handle.score_work.remote, [pack.work for pack in packs])
        return with_columns(batch, answer_columns(batch, packs, answers, self._info, self._payload))


def shape_of(output: EmbedOutput | None) -> tuple[bool, str]:
    """Whether the job folds chunks (``--truncate CHUNK``) and what its works ask for (no
    payload: no chunks, vectors)."""
    output = output or EmbedOutput()
    return output.chunked, output.output


def answer_columns(
    batch: pa.Table, packs: Sequence[Pack], answers: Sequence[Any], info: Any,
    output: EmbedOutput | None,
) -> dict[str, Any]:  # fmt: skip
    """The output columns of one batch's answered packs (``output`` None: the vectors as
    they are)."""
    output = output or EmbedOutput()
    if output.retrieval is not None:  # late interaction, sparse: each row's own answer
        rows: list[Any] = [None] * batch.num_rows
        for pack, answer in zip(packs, answers, strict=True):
            vectors = input_vectors(pack.work, answer, output.retrieval, output.role)
            for row, value in zip(pack.rows, vectors, strict=True):
                rows[row] = value
        return row_columns(rows, output.retrieval, output.parts)
    values, valid = vectors_of(batch.num_rows, packs, answers, info.pooling, output)
    return output_columns(values, valid, output)


def finish_embed(batch: pa.Table, tally: Any = None, columns: Any = None) -> pa.Table:
    """Rows, answered rows (those without an error) and refusals to ``tally``; the helper
    columns dropped."""
    answered = sum(error is None for error in batch.column("error").to_pylist())
    return finish_rows(batch, "embedding", HELPERS, tally, answered)


def embed_output(settings: ReplicaSettings, columns: EmbedColumns) -> EmbedOutput:
    """The engine stages' payload: ``columns.dimensions`` and ``types`` checked against the
    configured model, and the config's ``embedding_calibration``: a SettingsError when it is
    not an embedding model or the dimensions are past its vector's (before the job reads a
    row)."""
    from replicas.checkpoints.sources import load_hf_config, resolve_model_source
    from replicas.model.pooling_config import served_pooling_head

    source = resolve_model_source(settings.model.name)
    directory = None if source.is_gguf else source.directory
    head = served_pooling_head(directory, load_hf_config(source), settings.model)
    if head is None:
        raise SettingsError(f"model: {settings.model.name} is not an embedding model")
    if head.output != "vector":
        return retrieval_output(settings, columns)
    if columns.parts is not None:
        raise SettingsError("--outputs: a hybrid model's option, not this model's")
    if columns.input_type is not None:
        raise SettingsError(
            "--input-type: a late-interaction or sparse model's role; this model's prompts "
            "are --prompt-name's"
        )
    if columns.dimensions is not None and not 1 <= columns.dimensions <= head.dimension:
        raise SettingsError(f"--dimensions: 1..{head.dimension}, got {columns.dimensions}")
    try:  # a size the model was not trained to be cut to: as the route refuses it
        check_dimensions(columns.dimensions, head, "--dimensions")
    except ScoringError as error:
        raise SettingsError(error.message) from None
    calibration = NO_CALIBRATION
    if any(kind.endswith("int8") for kind in columns.types):
        calibration = load_calibration(settings.http.embedding_calibration, head.dimension)
    return EmbedOutput(columns.dimensions, columns.types, calibration, columns.truncate == "CHUNK")


def retrieval_output(settings: ReplicaSettings, columns: EmbedColumns) -> EmbedOutput:
    """A late-interaction or sparse model's payload, its options checked: no
    ``--dimensions`` or ``--embedding-types`` (a dense vector's); on late interaction no
    ``--truncate`` or ``--prompt-name`` (/pooling cuts each text to its role's length, behind
    its role's prompt); on a sparse or hybrid model ``--truncate`` NONE or END
    (/embed_sparse's ``truncate`` keeps the first tokens); ``--outputs`` a hybrid model's."""
    retrieval = retrieval_of(settings)
    assert retrieval is not None  # its head's output is not "vector"
    if columns.parts is not None and retrieval.output != "hybrid":
        raise SettingsError("--outputs: a hybrid model's option, not this model's")
    for flag, value in (("--dimensions", columns.dimensions), ("--embedding-types", columns.types)):
        if value:
            raise SettingsError(f"{flag}: a dense embedding model's option, not this model's")
    if retrieval.late is not None:
        if columns.truncate is not None:
            raise SettingsError(
                "--truncate: a late-interaction model cuts each text to its role's length"
            )
        if columns.prompt_name is not None:
            raise SettingsError(
                "--prompt-name: a late-interaction model's prompt is its role's (--input-type)"
            )
    elif columns.truncate not in (None, "NONE", "END"):
        raise SettingsError(f"--truncate: NONE or END on this model, got {columns.truncate}")
    role, parts = columns.input_type or "document", columns.parts or tuple(PARTS)
    return EmbedOutput(retrieval=retrieval, role=role, parts=parts)
