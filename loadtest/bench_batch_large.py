"""The large run of loadtest.bench_batch (issue 46): one ``score`` job of at least 50,000
shuffled token-id rows (``--large QxR``, default 2,000 queries of 25 rows), grouped in the
job, on a tiny random Llama (hidden 64, 2 layers, SmolLM2's vocabulary: SmolLM2 itself would
take most of an hour here), for what the shuffle costs at size: its rows, bytes and seconds,
the object store's peak use (polled every half second) and what it spilled.
"""

from __future__ import annotations

import random
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest.bench_batch_report import parse_shapes
from replicas.checkpoints.demo import tiny_model
from replicas.settings import ReplicaSettings

MIB = 2**20


def store_use() -> tuple[int, int]:
    """(object store bytes in use, bytes spilled so far) of the local cluster."""
    from ray._private.internal_api import memory_summary

    text = memory_summary(stats_only=True)
    used = re.search(r"Plasma memory usage (\d+) MiB", text)
    spilled = re.search(r"Spilled (\d+) MiB", text)
    return (int(used.group(1)) * MIB if used else 0, int(spilled.group(1)) * MIB if spilled else 0)


class StorePeak:
    """The object store's peak use while the ``with`` block runs (polled in a thread)."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.peak, self.spilled, self._period = 0, 0, period_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            try:
                used, spilled = store_use()
                self.peak, self.spilled = max(self.peak, used), max(self.spilled, spilled)
            except Exception:  # a poll that fails is a missing sample, not a failed run
                pass
            if self._done.wait(self._period):
                return

    def __enter__(self) -> StorePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()


def large_line(
    shape_text: str,
    settings: ReplicaSettings,
    batch_size: int,
    dataset_rows: Callable[[int, int, int], list[dict[str, Any]]],
) -> str:
    """Run the large job (on the Ray cluster already started) over ``dataset_rows(queries,
    rows per query, seed)`` shuffled, and describe it in one line."""
    from batch.pipeline import EngineOptions
    from loadtest.bench_batch_serve import timed_job

    (shape,) = parse_shapes(shape_text)
    rows = dataset_rows(shape.queries, shape.rows_per_query, 7)
    random.Random(7).shuffle(rows)
    with tempfile.TemporaryDirectory() as folder:
        tiny = settings.replace(model=str(tiny_model(Path(folder))))
        began = time.perf_counter()
        with StorePeak() as store:
            summary, _, wall = timed_job(rows, tiny, EngineOptions(batch_size=batch_size))
    spilled = max(store.spilled, summary.spilled_bytes)
    line = (
        f"large run, {shape.rows:,} rows ({shape.queries:,} queries x {shape.rows_per_query}), "
        f"shuffled, grouped in the job, tiny random Llama (hidden 64, 2 layers): "
        f"{summary.items_per_s:.0f} items/s over {wall:.1f} s wall "
        f"({time.perf_counter() - began:.0f} s with the model written); shuffle "
        f"{summary.shuffle_rows:,} rows, {summary.shuffle_bytes / MIB:.1f} MiB, "
        f"{summary.shuffle_ms / 1000:.1f} s (its operators' task time); {summary.steps} engine "
        f"steps, {summary.query_cache_hits} query cache hits; object store peak "
        f"{store.peak / MIB:.0f} MiB, spilled {spilled / MIB:.0f} MiB"
    )
    print(line, flush=True)
    return line
