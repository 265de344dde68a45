"""loadtest.sweep's results: per-rate summaries, two plots, the table of its result.

matplotlib loads inside the plotting function only (through ``Figure``, which renders with
Agg and never touches pyplot's global state), so the rest stays quick to import and test.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest.client import Outcome, percentile
from loadtest.harness import Table, col, table

PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Shot:
    """One request of the sweep: its outcome and when it left and came back (loop clock)."""

    outcome: Outcome
    sent_at: float
    done_at: float
    late_s: float = 0.0  # how long after its scheduled time it was sent


@dataclass(frozen=True)
class RateRow:
    """One offered rate's summary; latencies in seconds (NaN when there is no such answer)."""

    offered_rps: float
    requests: int
    wall_s: float  # first send to last answer
    achieved_rps: float  # 200 answers / wall_s
    items_per_s: float  # items of the 200 answers / wall_s
    status_200: int
    status_503: int
    reasons_503: dict[str, int]
    retry_after_503: int  # 503s that carried a Retry-After header
    status_other: int
    other_statuses: dict[str, int]  # "<status> <reason>" -> count
    client_errors: int  # no answer: client time-out or connection error (timeouts included)
    client_timeouts: int
    p50_s: float
    p90_s: float
    p99_s: float
    p50_503_s: float
    p90_503_s: float
    p99_503_s: float
    max_late_s: float  # the client's worst lag behind the arrival schedule

    def one_line(self) -> str:
        return (
            f"offered {self.offered_rps:g} req/s: {self.requests} sent, {self.status_200} ok, "
            f"{self.status_503} 503, {self.status_other} other, {self.client_errors} no answer; "
            f"{self.items_per_s:.2f} items/s, p50 {self.p50_s:.3f} s, p99 {self.p99_s:.3f} s"
        )


def _percentiles(values: Sequence[float]) -> list[float]:
    return [percentile(values, fraction) for fraction in PERCENTILES]


def summarize(rate: float, shots: Sequence[Shot], items: int) -> RateRow:
    """The row of one offered rate from its shots (``items`` per request)."""
    outcomes = [shot.outcome for shot in shots]
    ok = [o.seconds for o in outcomes if o.status == 200]
    shed = [o for o in outcomes if o.status == 503]
    other = [o for o in outcomes if o.status not in (0, 200, 503)]
    failed = [o for o in outcomes if o.status == 0]
    wall = max(s.done_at for s in shots) - min(s.sent_at for s in shots) if shots else 0.0
    per_s = 1.0 / wall if wall > 0 else 0.0
    return RateRow(
        rate,
        len(shots),
        wall,
        len(ok) * per_s,
        len(ok) * items * per_s,
        len(ok),
        len(shed),
        dict(collections.Counter(o.reason for o in shed)),
        sum(o.retry_after is not None for o in shed),
        len(other),
        dict(collections.Counter(f"{o.status} {o.reason}" for o in other)),
        len(failed),
        sum(o.reason == "client_timeout" for o in failed),
        *_percentiles(ok),
        *_percentiles([o.seconds for o in shed]),
        max((shot.late_s for shot in shots), default=0.0),
    )


def known(value: Any) -> Any:
    """NaN as None (JSON null, "-" in a table); everything else as it is."""
    return None if isinstance(value, float) and math.isnan(value) else value


def plain(row: RateRow) -> dict[str, Any]:
    return {key: known(value) for key, value in asdict(row).items()}


def plot(out: Path, rows: Sequence[RateRow], items: int) -> None:
    """latency.png (200s' P50/P90/P99 against offered rate) and throughput.png (items/s)."""
    from matplotlib.figure import Figure

    rates = [row.offered_rps for row in rows]
    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    axes = figure.subplots()
    for name, key, style in (("P50", "p50_s", "-"), ("P90", "p90_s", "--"), ("P99", "p99_s", ":")):
        values = [getattr(row, key) for row in rows]
        axes.plot(rates, values, style, marker="o", label=name)
    axes.set(xlabel="offered rate (requests/s)", ylabel="latency of 200 answers (s)")
    axes.set_title("/v1/score latency, open-loop Poisson arrivals")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(out / "latency.png", dpi=120)

    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    axes = figure.subplots()
    axes.plot(rates, [row.items_per_s for row in rows], marker="o", label="achieved")
    axes.plot(
        rates, [rate * items for rate in rates], "--", color="gray", label="ideal (offered x items)"
    )
    axes.set(xlabel="offered rate (requests/s)", ylabel="items scored per second (200s)")
    axes.set_title(f"/v1/score throughput, {items} items per request")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(out / "throughput.png", dpi=120)


COLUMNS = (
    col("offered req/s", "g"), col("sent", "d"), col("200", "d"), col("503", "d"),
    col("other", "d"), col("no answer", "d"), col("achieved req/s", ".3f"),
    col("items/s", ".2f"), col("p50 s", ".3f"), col("p90 s", ".3f"), col("p99 s", ".3f"),
    col("503 p50 s", ".3f"), col("503 p99 s", ".3f"),
)  # fmt: skip


def rates_table(rows: Sequence[RateRow]) -> Table:
    cells = [
        tuple(map(known, (r.offered_rps, r.requests, r.status_200, r.status_503,
              r.status_other, r.client_errors, r.achieved_rps, r.items_per_s, r.p50_s, r.p90_s,
              r.p99_s, r.p50_503_s, r.p99_503_s)))
        for r in rows
    ]  # fmt: skip
    return table(COLUMNS, cells)
