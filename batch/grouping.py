"""Grouping inside the job: rows brought together by query (or by length) with Ray Data's own
hash shuffle, so that a dataset in any order packs as sorted input does (issue 46).

After the CPU stage each row gets a ``_sj_group`` key (``group_keys``): a stable 64-bit hash
of what makes rows one multi-item work (the query's token ids and labels; ``loglik``: the
context's whole 16-token blocks, which the engine computes once for every row that shares
them), or the token bucket of the row's length (``query_likelihood`` rerank, ``classify``),
so a call packs full steps. ``Dataset.repartition(n, keys=[GROUP])`` (a hash shuffle: every
row of a key lands in the same block, Ray Data spills what the object store cannot hold)
brings each key's rows together, and ``InCalls`` runs the engine stage on each shuffled block
in calls of at most ``call_rows`` rows cut between groups: a call's trailing group is never
cut, and a group larger than a call is split into calls that run back to back on the same
actor (its query stays in that engine's query cache).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batch.score_stage import QUERY_IDS
from batch.stages import report
from batch.works import ITEMS, LABELS, QUERY

GROUP = "_sj_group"
PREFIX_BLOCK = 16  # the engine's prefix-reuse block (replicas.engine.layouts.token_steps)
KINDS = ("score", "query", "context", "length")
# Shuffle operators in Ray Data's stats (their time and bytes go to the summary).
SHUFFLE_OPS = ("Repartition", "Shuffle", "Sort")


@dataclass(frozen=True)
class GroupBy:
    """What brings a mode's rows together: ``score`` (``score``'s query ids), ``query`` (a
    work's query and labels; prompt works by length), ``context`` (a prompt's whole context
    blocks; ``context_column``: how many of its last tokens are not context) or ``length``
    (the token bucket of a row's tokens, from ``buckets``; ``ids_column``: a column of one
    token-id list a row, as ``embed``'s, else the works' columns)."""

    kind: str
    buckets: tuple[int, ...] = ()
    context_column: str | None = None
    ids_column: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"group kind: one of {KINDS}, got {self.kind!r}")


def _hash(*parts: Sequence[int]) -> int:
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(np.asarray(part, np.int32).tobytes())
        digest.update(b"|")
    return int.from_bytes(digest.digest(), "little", signed=True)


def _bucket(length: int, buckets: tuple[int, ...]) -> int:
    """The token bucket holding ``length`` tokens (past the last: the length itself)."""
    for bucket in buckets:
        if length <= bucket:
            return bucket
    return length


def _id_lists(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """Each row of a ``list<int32>`` column as an array (None for a null row), no Python ints."""
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    return [None if nulls[r] else values[offsets[r] : offsets[r + 1]] for r in range(len(array))]


def group_keys(batch: pa.Table, by: GroupBy) -> np.ndarray:
    """Each row's int64 group key (a refused row: 0)."""
    keys = np.zeros(batch.num_rows, np.int64)
    if by.kind == "length" and by.ids_column:
        for row, ids in enumerate(_id_lists(batch.column(by.ids_column))):
            keys[row] = 0 if ids is None else _bucket(len(ids), by.buckets)
        return keys
    if by.kind == "score":
        for row, ids in enumerate(_id_lists(batch.column(QUERY_IDS))):
            keys[row] = 0 if ids is None else _hash(ids)
        return keys
    queries = batch.column(QUERY).to_pylist()
    labels = batch.column(LABELS).to_pylist()
    items = batch.column(ITEMS).to_pylist()
    tails = batch.column(by.context_column).to_pylist() if by.context_column else None
    for row, (query, label, item) in enumerate(zip(queries, labels, items, strict=True)):
        if item is None:
            continue
        if by.kind == "length":
            keys[row] = _bucket(len(query) if query is not None else len(item[0]), by.buckets)
        elif query is not None:  # a ScoreWork: one multi-item work with its query's rows
            keys[row] = _hash(query, label)
        elif by.kind == "context" and tails is not None:
            (prompt,) = item
            blocks = (len(prompt) - tails[row]) // PREFIX_BLOCK * PREFIX_BLOCK
            keys[row] = _hash(prompt[:blocks])
        else:  # a prompt work (query_likelihood rerank): packs full steps by length
            keys[row] = _bucket(len(item[0]), by.buckets)
    return keys


def add_group_key(batch: pa.Table, by: GroupBy, tally: Any = None) -> pa.Table:
    """``batch`` with its ``GROUP`` column; its rows and bytes (what the shuffle moves) to
    ``tally``."""
    out = batch.append_column(GROUP, pa.array(group_keys(batch, by), pa.int64()))
    report(tally, {"shuffle_rows": out.num_rows, "shuffle_bytes": out.nbytes})
    return out


def call_ranges(keys: np.ndarray, call_rows: int) -> list[tuple[int, int]]:
    """Calls ``[start, stop)`` over rows sorted by key: whole groups while they fit in
    ``call_rows``; a group larger than a call is cut into calls of ``call_rows`` rows (its
    rest opens the next call)."""
    size = len(keys)
    runs = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), size]
    calls, start = [], 0
    for begin, end in itertools.pairwise(runs):
        if end - start <= call_rows:
            continue  # the group joins the open call
        if begin > start:
            calls.append((start, begin))
            start = begin
        while end - start > call_rows:
            calls.append((start, start + call_rows))
            start += call_rows
    if size > start:
        calls.append((start, size))
    return calls


class InCalls:
    """An engine stage (``stage(*args)``, one per actor) over a shuffled block: its rows
    sorted by ``GROUP`` and scored in ``call_ranges`` calls, back to back on this actor."""

    def __init__(self, stage: type, args: tuple[Any, ...], call_rows: int) -> None:
        self._stage, self._call_rows = stage(*args), call_rows

    @classmethod
    def around(cls, stage: Any, call_rows: int) -> InCalls:
        """Over a stage already built (in-process use, tests)."""
        made = cls.__new__(cls)
        made._stage, made._call_rows = stage, call_rows
        return made

    def __call__(self, batch: pa.Table) -> pa.Table:
        keys = batch.column(GROUP).to_numpy()
        order = np.argsort(keys, kind="stable")
        batch, keys = batch.take(pa.array(order)), keys[order]
        calls = call_ranges(keys, self._call_rows) or [(0, 0)]
        out = pa.concat_tables([self._stage(batch.slice(a, b - a)) for a, b in calls])
        return out.drop_columns([GROUP])


def partitions(ds: Any, block_rows: int, replicas: int) -> int:
    """How many blocks the shuffle makes: about ``block_rows`` rows each (a call's, by
    default), at least one per engine actor (the input's row count: Parquet's from metadata,
    other formats read once)."""
    with warnings.catch_warnings():  # checkpointing applies to the write, not to this count
        warnings.simplefilter("ignore")
        rows = ds.count()
    return max(replicas, math.ceil(rows / block_rows), 1)


def shuffle_cost(ds: Any) -> dict[str, int]:
    """The shuffle operators' time (ms, summed over their tasks) and the bytes the object
    store spilled, from Ray Data's stats of the executed ``ds`` (empty: no stats there)."""
    try:
        summary = ds.get_stats_summary()
    except Exception:  # stats are a report, never a reason to fail the job
        return {}
    found = {"shuffle_ms": 0, "spilled_bytes": int(summary.dataset_bytes_spilled or 0)}
    stack = [summary]
    while stack:  # the summary and its parents (the operators before a fused one)
        stats = stack.pop()
        stack += stats.parents
        for op in stats.operators_stats:
            if any(name in op.operator_name for name in SHUFFLE_OPS):
                found["shuffle_ms"] += round(1000 * op.time_total_s)
    return found


@dataclass(frozen=True)
class Grouping:
    """A job's grouping: the key, the shuffle's block count, the key stage's CPUs, the tally."""

    by: GroupBy
    blocks: int
    cpu_share: float = 0.25
    tally: Any = None


def engine_map(
    ds: Any,
    stage: type,
    args: tuple[Any, ...],
    options: Any,
    grouping: Grouping | None,
    **remote: Any,
) -> Any:
    """``ds`` through the engine stage ``stage(*args)`` (``options.replicas`` actors): in
    calls of ``options.batch_size`` rows in input order, or (``grouping``) keyed, shuffled
    into ``grouping.blocks`` blocks and scored block by block in whole-group calls."""
    common = {"batch_format": "pyarrow", "concurrency": options.replicas, **remote}
    if grouping is None:
        return ds.map_batches(
            stage, fn_constructor_args=args, batch_size=options.batch_size, **common
        )
    keyed = ds.map_batches(
        add_group_key,
        fn_kwargs={"by": grouping.by, "tally": grouping.tally},
        batch_format="pyarrow",
        batch_size=None,
        num_cpus=grouping.cpu_share,
    )
    shuffled = keyed.repartition(grouping.blocks, keys=[GROUP])
    return shuffled.map_batches(
        InCalls,
        fn_constructor_args=(stage, args, options.batch_size),
        batch_size=None,
        **common,
    )


def shuffle_blocks(ds: Any, options: Any) -> int | None:
    """The shuffle's block count of a job (``EngineOptions``; None: ``--no-group``)."""
    if not options.group:
        return None
    return partitions(ds, options.block_rows or options.batch_size, options.replicas)


def job_grouping(ds: Any, options: Any, by: GroupBy, tally: Any) -> Grouping | None:
    """How a job's rows are brought together before its engine stage (None: ``--no-group``)."""
    blocks = shuffle_blocks(ds, options)
    return None if blocks is None else Grouping(by, blocks, options.cpu_share, tally)
