"""loadtest.bench_serve's pure parts: ratios, its table rows, targets, notes, the URL check.

No server, no jax, no torch: runs in well under a second.
"""

from __future__ import annotations

import pytest

from loadtest.bench_serve_report import (
    COLUMNS,
    CacheResult,
    Compiles,
    ItemsRow,
    Report,
    Sample,
    Timing,
    Workload,
    notes,
    row_cells,
    stat_delta,
    summarize,
    targets,
    targets_table,
)
from loadtest.harness import loopback_url, parser_for, table
from loadtest.workloads import workload


def test_stats_deltas_are_defensive_and_summarized() -> None:
    assert stat_delta({"engine_seconds": 1.0}, {"engine_seconds": 1.5}, "engine_seconds") == 0.5
    assert stat_delta({}, {"engine_seconds": 1.5}, "engine_seconds") is None
    assert stat_delta({"x": True}, {"x": False}, "x") is None
    before = {"engine_seconds": 0.0, "computed_tokens": 0, "useful_tokens": 0}
    after = {"engine_seconds": 0.5, "computed_tokens": 120, "useful_tokens": 100}
    timing = summarize([Sample.between(0.6, before, after), Sample.between(0.8, {}, {})])
    assert timing.wall_s == pytest.approx(0.7)
    assert timing.served_over_engine is None and timing.padding is None
    timing = summarize([Sample.between(0.6, before, after)])
    assert timing.served_over_engine == pytest.approx(1.2)
    assert timing.padding == pytest.approx(1.2)


def _report(compiles: Compiles) -> Report:
    rows = (
        ItemsRow(1, Timing(0.3, 1.1, 1.7), Timing(0.3), 0.4, 0.5),
        ItemsRow(10, Timing(0.4, 1.05, 1.1), Timing(3.2), 3.6, 0.62),
        ItemsRow(100, Timing(1.5, 1.02, 1.1), Timing(34.0), 56.0, 0.43),
        ItemsRow(1000, notes="multi-item: HTTP 400 too_many_items"),
    )
    return Report(
        rows=rows,
        cache=CacheResult(items=10, pairs=3, cold_s=0.5, warm_s=0.2, warm_hits=3),
        compiles=compiles,
        peak_flops=479e9,
        workload=Workload(300, 10, 3),
        hf=True,
    )


def test_row_ratios_and_formatting() -> None:
    row = ItemsRow(10, Timing(0.4, 1.05, 1.1), Timing(3.2), 3.6, 0.62)
    empty = ItemsRow(1000, notes="multi-item: HTTP 400 a|b")
    *_, first, second = table(COLUMNS, [row_cells(row), row_cells(empty)]).markdown().splitlines()
    assert first == "| 10 | 0.400 | 3.200 | 3.600 | 8.0x | 9.0x | 1.1x | 1.05 | 1.10 | 62% |  |"
    assert second == "| 1000 | - | - | - | - | - | - | - | - | - | multi-item: HTTP 400 a/b |"


def test_targets_measured_values_and_verdicts() -> None:
    report = _report(Compiles(request_path=0, background=2, total=2))
    found = {t.goal: (t.shown, t.verdict) for t in targets(report)}
    assert found["multi-item >= 6x own single-item, 10 items"] == ("8.0x", "met")
    assert found["multi-item >= 19x own single-item, 100 items"] == ("22.7x", "met")
    assert found["multi-item >= 10x transformers, 10 items"] == ("9.0x", "missed")
    assert found["multi-item >= 30x transformers, 100 items"] == ("37.3x", "met")
    own = found["own single-item time <= transformers time (speed-up >= 1.0x, every N)"]
    assert own == ("1.1x (worst: 10 items)", "met")
    served = found["served/engine <= 1.3 (multi-item, every N)"]
    assert served == ("1.10 (worst: 1 item)", "met")
    assert found["model FLOP/s >= 60% of measured peak, 100 items"] == ("43%", "missed")
    assert found["cached query >= 2.5x faster, 10 items"] == ("2.5x", "met")
    assert found["0 request-path compiles"] == ("0", "met")
    padding = found["padding (computed / useful tokens) <= 1.15 (multi-item, every N)"]
    assert padding == ("1.70 (worst: 1 item)", "missed")


def test_missing_stats_fields_print_dashes() -> None:
    report = _report(Compiles.between({"compile_count": 18}, {"compile_count": 18}))
    assert "| 0 request-path compiles | - | not measured |" in targets_table(report).markdown()
    body = "\n".join(notes(report))
    assert "request path -, background -, compile_count +0" in body
    assert "479 GFLOP/s" in body


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com:8000",
        "http://10.0.0.5:8000",
        "http://localhost.evil.com",
        "ftp://127.0.0.1",
    ],
)
def test_non_loopback_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        loopback_url(url)
    with pytest.raises(SystemExit):
        from loadtest.harness import run_workload

        run_workload(workload("serve"), ["--url", url])


def test_loopback_urls_are_accepted() -> None:
    assert loopback_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert loopback_url("http://localhost:8000") == "http://localhost:8000"
    assert loopback_url("http://[::1]:8000") == "http://[::1]:8000"
    args = parser_for(workload("serve")).parse_args(["--items", "1,10", "--no-hf"])
    assert args.items == "1,10" and args.slow_items == "1,10,100" and not args.hf
