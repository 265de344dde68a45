"""The works of the rerank, loglik and classify modes as Arrow columns (CPU stage -> engine
stage), one engine call's answers for them, each row its own, and the two stages on them.

A row's work is a one-item ScoreWork (rerank yes_no / head, classify) or a one-prompt
PromptWork (rerank query_likelihood, loglik), on a cross-encoder an EmbedWork of its pairs
(rerank: one per chunk) or its one text (classify), on a late-interaction or sparse model an
EmbedWork of its query and its document's chunks asking for that ``output`` (rerank), or
None (refused). ``PrepareWorks`` (CPU)
writes each prepared row's work as token-id columns (a subclass's ``prepare``: the route's
own code). ``EngineWorks`` (one per accelerator host; token ids and answers only, no
tokenizer) packs a batch's works (score works by query, ``batch.packing``; prompt works into
prompt works, ``pack_prompts``), makes one call for all packs and hands each row its own
answer to the mode's ``Results``. ``--engine serve`` swaps ``EngineWorks`` for
``batch.serve_stage.ServeWorks``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from batch.packing import pack_works, unpack
from batch.stages import EngineStage, PrepareRows, with_columns
from replicas.contract import EmbedWork, PromptWork, ScoreWork, ScoringLimits, check_limits
from replicas.errors import ScoringError

Work = ScoreWork | PromptWork | EmbedWork
QUERY, ITEMS, LABELS = "_sj_work_query", "_sj_work_items", "_sj_work_labels"
TOP_K, TAIL, KEEP = "_sj_work_top_k", "_sj_work_tail", "_sj_work_keep"
SECOND = "_sj_work_second"  # a cross-encoder's EmbedWork: where each input's type 1 starts
# an EmbedWork's output other than vectors (late interaction, sparse) and its query-only tokens
OUTPUT, QUERY_ONLY = "_sj_work_output", "_sj_work_query_only"
WORK_COLUMNS = (QUERY, ITEMS, LABELS, TOP_K, TAIL, KEEP, SECOND, OUTPUT, QUERY_ONLY)
IDS = pa.list_(pa.int32())  # [tokens]
# (the batch, each row's work, each row's answer) -> the mode's result columns
Results = Callable[[pa.Table, list[Work | None], list[Any]], dict[str, pa.Array]]


def work_columns(works: Sequence[Work | None]) -> dict[str, pa.Array]:
    """Each row's work as token-id columns (``QUERY`` null: a prompt work, or with
    ``SECOND`` set an EmbedWork's inputs: a cross-encoder's, or with ``OUTPUT`` set a
    late-interaction or sparse model's; all null: none)."""
    scored = [w if isinstance(w, ScoreWork) else None for w in works]
    prompted = [w if isinstance(w, PromptWork) else None for w in works]
    paired = [w if isinstance(w, EmbedWork) else None for w in works]
    retrieved = [w if w is not None and w.output != "vector" else None for w in paired]
    items = [None if w is None else [list(i) for i in _inputs(w)] for w in works]
    return {
        QUERY: pa.array([list(w.query_ids) if w else None for w in scored], IDS),
        ITEMS: pa.array(items, pa.list_(IDS)),
        LABELS: pa.array([list(w.label_ids) if w else None for w in scored], IDS),
        TOP_K: pa.array([w.top_k if w else None for w in prompted], pa.int32()),
        TAIL: pa.array([w.scored_tail if w else None for w in prompted], pa.int32()),
        KEEP: pa.array([w.keep_lone_prefixes if w else None for w in prompted], pa.bool_()),
        SECOND: pa.array([_seconds(w) if w else None for w in paired], IDS),
        OUTPUT: pa.array([w.output if w else None for w in retrieved], pa.string()),
        QUERY_ONLY: pa.array([_query_only(w) if w else None for w in retrieved], IDS),
    }


def _inputs(work: Work) -> tuple[tuple[int, ...], ...]:
    if isinstance(work, ScoreWork):
        return work.item_ids
    return work.prompts if isinstance(work, PromptWork) else work.inputs


def _seconds(work: EmbedWork) -> list[int]:
    return [work.second_start(i) for i in range(work.num_items)]


def _query_only(work: EmbedWork) -> list[int]:
    return [work.query_only_tokens(i) for i in range(work.num_items)]


def read_works(batch: pa.Table, adapter: str | None = None) -> list[Work | None]:
    """The works ``work_columns`` wrote into ``batch``, each run with ``adapter`` (the job's
    ``--model``; None: the base model)."""
    columns = {name: batch.column(name).to_pylist() for name in WORK_COLUMNS}
    out: list[Work | None] = []
    rows = zip(*columns.values(), strict=True)
    for query, items, labels, top_k, tail, keep, second, output, query_only in rows:
        if items is None:
            out.append(None)
        elif output is not None:
            inputs = tuple(map(tuple, items))
            fills = tuple(query_only) if any(query_only) else ()
            out.append(EmbedWork(inputs, adapter=adapter, output=output, query_only=fills))
        elif second is not None:
            inputs = tuple(map(tuple, items))
            out.append(EmbedWork(inputs, adapter=adapter, second_starts=tuple(second)))
        elif query is not None:
            items = tuple(map(tuple, items))
            out.append(ScoreWork(tuple(query), items, tuple(labels), adapter=adapter))
        else:
            prompts = tuple(map(tuple, items))
            out.append(PromptWork(prompts, top_k, None, keep, tail, adapter=adapter))
    return out


def _fits(work: PromptWork, limits: ScoringLimits) -> bool:
    try:
        check_limits(work, limits, True)
    except ScoringError:
        return False
    return True


def _merged(works: Sequence[Work | None], rows: list[int]) -> PromptWork:
    first = works[rows[0]]
    assert isinstance(first, PromptWork)
    prompts = tuple(p for r in rows for p in works[r].prompts)  # type: ignore[union-attr]
    return PromptWork(
        prompts, first.top_k, None, first.keep_lone_prefixes, first.scored_tail, first.adapter
    )


def pack_prompts(
    works: Sequence[Work | None], limits: ScoringLimits
) -> list[tuple[PromptWork, list[int]]]:
    """One-prompt works of the same kind (scored tail, top_k) merged into prompt works, in row
    order, cut where the next prompt would break a limit; with the rows each holds."""
    groups: dict[tuple, list[int]] = {}
    for row, work in enumerate(works):
        if isinstance(work, PromptWork):
            key = (work.scored_tail, work.top_k, work.keep_lone_prefixes, work.adapter)
            groups.setdefault(key, []).append(row)
    packs: list[tuple[PromptWork, list[int]]] = []
    for rows in groups.values():
        current: list[int] = []
        for row in rows:
            if current and not _fits(_merged(works, [*current, row]), limits):
                packs.append((_merged(works, current), current))
                current = []
            current.append(row)
        packs.append((_merged(works, current), current))
    return packs


def pack_pairs(
    works: Sequence[Work | None], limits: ScoringLimits
) -> list[tuple[EmbedWork, list[int]]]:
    """EmbedWorks (a cross-encoder's, a late-interaction or sparse model's) merged in row
    order, one adapter and output each, cut where the next row's inputs would pass
    ``max_items_per_request`` or ``max_request_tokens``."""
    groups: dict[tuple[str | None, str], list[int]] = {}
    for row, work in enumerate(works):
        if isinstance(work, EmbedWork):
            groups.setdefault((work.adapter, work.output), []).append(row)
    packs: list[tuple[EmbedWork, list[int]]] = []
    for (adapter, _), rows in groups.items():
        current: list[int] = []
        for row in rows:
            if current and not _pair_fits([*current, row], works, limits):
                packs.append((_pairs(works, current, adapter), current))
                current = []
            current.append(row)
        packs.append((_pairs(works, current, adapter), current))
    return packs


def _pair_fits(rows: list[int], works: Sequence[Work | None], limits: ScoringLimits) -> bool:
    inputs = [ids for row in rows for ids in works[row].inputs]  # type: ignore[union-attr]
    tokens = sum(len(ids) for ids in inputs)
    most = limits.max_request_tokens
    return len(inputs) <= limits.max_items_per_request and (most is None or tokens <= most)


def _pairs(works: Sequence[Work | None], rows: list[int], adapter: str | None) -> EmbedWork:
    picked: list[EmbedWork] = [works[row] for row in rows]  # type: ignore[misc]
    inputs = tuple(ids for work in picked for ids in work.inputs)
    if picked[0].output != "vector":  # each row's query and documents, end to end
        fills = tuple(n for work in picked for n in _query_only(work))
        output = picked[0].output
        return EmbedWork(
            inputs, adapter=adapter, output=output, query_only=fills if any(fills) else ()
        )
    seconds = tuple(s for work in picked for s in _seconds(work))
    return EmbedWork(inputs, adapter=adapter, second_starts=seconds)


def row_answers(
    works: Sequence[Work | None],
    limits: ScoringLimits,
    multi_item: bool,
    call: Callable[[list[Work]], list[Any]],
) -> list[Any]:
    """Each row's own answer (``[items, labels]`` log-probs, or its prompts' PromptLogprobs
    as a list: one per prompt, several for a chunked rerank row), None for
    a refused row; ``call`` scores a list of works (an engine's ``score_batch``, or calls
    through a Serve handle) and answers them in order."""
    scoring = [w if isinstance(w, ScoreWork) and w.num_items else None for w in works]
    score_packs = pack_works(scoring, limits, multi_item)
    merged = pack_prompts(works, limits) + pack_pairs(works, limits)
    answers = call([p.work for p in score_packs] + [w for w, _ in merged])
    out: list[Any] = [None] * len(works)
    for row, answer in enumerate(unpack(score_packs, answers[: len(score_packs)], len(works))):
        if scoring[row] is not None:
            out[row] = answer
    for (_, rows), answer in zip(merged, answers[len(score_packs) :], strict=True):
        at = 0
        for row in rows:
            count = works[row].num_items  # type: ignore[union-attr]
            out[row], at = list(answer[at : at + count]), at + count
    return out


class PrepareWorks(PrepareRows):
    """A mode on token-id works: ``prepare(row)`` (a subclass's) gives the route's prepared
    request or its ScoringError, ``work_of`` its work, ``extra`` more helper columns."""

    def work_of(self, prepared: Any) -> Work:
        """The work of a prepared row (``prepared.work``)."""
        return prepared.work

    def extra(self, prepared: list[Any]) -> dict[str, pa.Array]:
        return {}

    def helper_columns(self, prepared: list[Any]) -> dict[str, pa.Array]:
        works = [None if p is None else self.work_of(p) for p in prepared]
        return work_columns(works) | self.extra(prepared)


class EngineWorks(EngineStage):
    """The engine stage on token-id works (payload: the mode's ``Results``, a module-level
    function or a picklable callable)."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        works = read_works(batch, self._adapter)
        info = self._engine.info
        multi_item = info.multi_item_scoring_delimiter is not None
        answers = row_answers(works, info.limits, multi_item, self.call)
        return with_columns(batch, self._payload(batch, works, answers))
