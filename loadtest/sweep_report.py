"""loadtest.sweep's results: per-rate summaries, results.csv/.json, two plots, a markdown table.

matplotlib loads inside the plotting function only (through ``Figure``, which renders with
Agg and never touches pyplot's global state), so the rest stays quick to import and test.
"""

from __future__ import annotations

import collections
import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from loadtest.load import percentile
from loadtest.overload import Outcome

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


def _plain(value: Any) -> Any:
    """NaN as None (JSON null, an empty CSV cell); everything else as it is."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{key}={count}" for key, count in sorted(value.items()))
    return "" if _plain(value) is None else value


def write_csv(path: Path, parameters: Mapping[str, Any], rows: Sequence[RateRow]) -> None:
    """One line per rate: the run's parameters, then the row's fields."""
    columns = [*parameters, *(f.name for f in fields(RateRow))]
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in {**parameters, **asdict(row)}.items()})


def write_json(path: Path, parameters: Mapping[str, Any], rows: Sequence[RateRow]) -> None:
    body = {
        "parameters": dict(parameters),
        "rows": [{k: _plain(v) for k, v in asdict(row).items()} for row in rows],
    }
    path.write_text(json.dumps(body, indent=1) + "\n")


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


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def markdown_table(rows: Sequence[RateRow]) -> str:
    lines = [
        "| offered req/s | sent | 200 | 503 | other | no answer | achieved req/s | items/s "
        "| p50 s | p90 s | p99 s | 503 p50 s | 503 p99 s |",
        "|" + "---:|" * 13,
    ]
    for row in rows:
        cells = [
            f"{row.offered_rps:g}",
            *(str(n) for n in (row.requests, row.status_200, row.status_503)),
            *(str(n) for n in (row.status_other, row.client_errors)),
            f"{row.achieved_rps:.3f}",
            f"{row.items_per_s:.2f}",
            *(_seconds(s) for s in (row.p50_s, row.p90_s, row.p99_s)),
            *(_seconds(s) for s in (row.p50_503_s, row.p99_503_s)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(out: Path, parameters: Mapping[str, Any], rows: Sequence[RateRow]) -> str:
    """results.csv, results.json and both plots into ``out``; returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "results.csv", parameters, rows)
    write_json(out / "results.json", parameters, rows)
    plot(out, rows, int(parameters["items"]))
    return f"{markdown_table(rows)}\n\nresults: {out}/"
