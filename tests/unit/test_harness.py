"""The benchmark runner (loadtest.harness, loadtest.render, python -m loadtest): every benchmark
is listed, a result round-trips through JSON, render rebuilds the docs' tables from the stored
results. No Ray, no model: well under a second."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from pathlib import Path

import pytest

from loadtest.__main__ import main
from loadtest.harness import RESULTS, ROOT, Option, Result, col, load_results, table, timed_together
from loadtest.render import render, render_text, section
from loadtest.workloads import REGISTRY

RESULT = Result(
    key="demo",
    workload="engine",
    title="Demo",
    machine="Test CPU, 2 cores",
    tree="abc1234",
    date="2026-01-01",
    command="python -m loadtest run engine --items 1",
    settings={"items": "1", "hf": True},
    notes=("one note",),
    tables=(
        table(
            [col("items", "d"), col("s", ".3f"), col("vs", ".1f", "x"), col("share", ".0%")],
            [(1, 0.5, 2.0, 0.53), (10, None, 12.345, "n/a")],
            title="First:",
        ),
        table([col("what", left=True), col("count", "d")], [("a|b", 3.0)], missing=""),
    ),
    figures={"peak": 1.5e11},
)


def test_list_names_every_benchmark_and_tool() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["list"]) == 0
    listed = [line.split()[0] for line in out.getvalue().splitlines()]
    assert listed == list(REGISTRY)
    modules = {module for module, _ in REGISTRY.values()}
    # every module that measures or drives something is registered (the rest are its parts)
    for path in (ROOT / "loadtest").glob("*.py"):
        if re.search(r"^WORKLOAD = ", path.read_text(), re.MULTILINE):
            assert path.stem in modules, path.name


def test_a_result_round_trips_through_json(tmp_path: Path) -> None:
    path = RESULT.save(tmp_path)
    assert path == tmp_path / "demo.json"
    assert Result.from_json(path.read_text()) == RESULT
    assert load_results(tmp_path) == [RESULT]


def test_tables_write_each_figure_in_its_column_format() -> None:
    first, second = RESULT.tables
    assert first.markdown().splitlines() == [
        "| items | s | vs | share |",
        "|---:|---:|---:|---:|",
        "| 1 | 0.500 | 2.0x | 53% |",
        "| 10 | - | 12.3x | n/a |",
    ]
    assert second.markdown().splitlines()[1:] == ["|---|---:|", "| a/b | 3 |"]


def test_render_rebuilds_a_section_between_its_markers_and_keeps_the_rest() -> None:
    doc = "# Benchmarks\n\nHand text.\n\n<!-- result: demo -->\nstale\n"
    doc += "<!-- /result: demo -->\n\nTail.\n"
    out = render_text(doc, [RESULT])
    assert out.startswith("# Benchmarks\n\nHand text.\n\n<!-- result: demo -->\n## Demo\n")
    assert out.endswith("<!-- /result: demo -->\n\nTail.\n") and "stale" not in out
    body = section(RESULT)
    for text in (
        "`python -m loadtest run engine --items 1` on Test CPU, 2 cores; tree abc1234, 2026-01-01.",
        "- one note",
        "First:\n\n| items | s | vs | share |",
        "| 10 | - | 12.3x | n/a |",
    ):
        assert text in body
    assert render_text(out, [RESULT]) == out  # idempotent
    appended = render_text("# Benchmarks\n", [RESULT])
    assert appended == "# Benchmarks\n\n" + section(RESULT) + "\n"


def test_render_writes_only_the_docs_whose_results_changed(tmp_path: Path) -> None:
    results = tmp_path / "results"
    RESULT.save(results)
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    assert render(results, tmp_path) == [doc]
    assert render(results, tmp_path) == []
    assert "| 1 | 0.500 | 2.0x | 53% |" in doc.read_text()


def test_the_stored_results_rebuild_the_committed_docs() -> None:
    """docs/benchmarks.md and docs/tpu.md are what `python -m loadtest render` writes."""
    for result in load_results(RESULTS):
        text = (ROOT / result.doc).read_text()
        assert section(result) in text, result.key


def test_options_parse_counts_flags_and_their_negations() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    for option in (Option("--items", "1,10"), Option("--repeats", 3), Option("--no-hf", True),
                   Option("--tiny", False), Option("--rate", 0.0)):  # fmt: skip
        option.add_to(parser)
    args = parser.parse_args(["--repeats", "5", "--no-hf", "--rate", "2.5"])
    assert (args.items, args.repeats, args.hf, args.tiny, args.rate) == (
        "1,10",
        5,
        False,
        False,
        2.5,
    )


def test_timed_together_runs_every_call_in_turn_and_keeps_the_last_answers() -> None:
    calls: list[str] = []
    times = timed_together(
        {"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, 2
    )
    assert calls == ["a", "b"] * 3  # one untimed round, then two timed ones
    assert set(times) == {"a", "b"} and times.last == {"a": 1, "b": 2}


def test_timed_together_shuffles_the_order_when_asked() -> None:
    calls: list[str] = []
    timed_together({n: (lambda n=n: calls.append(n)) for n in "abcd"}, 6, warm=0, shuffle=True)
    rounds = ["".join(calls[i : i + 4]) for i in range(0, 24, 4)]
    assert all(sorted(r) == list("abcd") for r in rounds)  # each call once a round
    followers = {r[r.index("a") + 1] for r in rounds if not r.endswith("a")}
    assert len(followers) > 1  # "a" is not always followed by the same call


def test_timings_hold_samples_spread_load_and_counters_and_store_as_medians() -> None:
    ticks = iter(range(100))
    times = timed_together(
        {"a": lambda: next(ticks)}, 5, warm=0, counters=lambda: {"n": next(ticks), "x": "y"}
    )
    assert len(times.samples["a"]) == 5 and times.last == {"a": 5}
    assert times.moved == {"n": 6} and len(times.load) == 2
    low, high = times.spread("a")
    assert times.best("a") <= low <= times["a"] <= high and dict(times) == {"a": times["a"]}
    saved = Result.from_json(dataclasses.replace(RESULT, figures={"t": times}).to_json())
    assert saved.figures == {"t": {"a": times["a"]}}


def test_unknown_commands_print_the_usage() -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["run", "no-such-benchmark"]) == 2
        assert main([]) == 0


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "ftp://127.0.0.1"])
def test_a_served_benchmark_refuses_a_non_loopback_url(url: str) -> None:
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        main(["run", "rerank", "--url", url])


def test_a_run_records_its_command_without_the_results_folder() -> None:
    import argparse

    from loadtest.harness import Run, Workload

    run = Run(Workload(name="engine"), argparse.Namespace(items="1", out=Path("/tmp/x")),
              ["--items", "1", "--out", "/tmp/x", "--no-hf"])  # fmt: skip
    result = run.result("Demo", [])
    assert result.command == "python -m loadtest run engine --items 1 --no-hf"
    assert result.settings == {"items": "1"} and result.machine and result.tree
