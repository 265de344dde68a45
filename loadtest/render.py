"""``python -m loadtest render``: the stored results (docs/results/*.json) as the docs' tables.

Each result is one section between ``<!-- result: KEY -->`` and ``<!-- /result: KEY -->`` of
its doc (docs/benchmarks.md unless it names another): its title, the command, machine, tree
and date it ran on, its notes and its tables. Text outside the markers is kept as written; a
result whose markers are missing is appended at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loadtest.harness import RESULTS, ROOT, Result, load_results


def start_marker(key: str) -> str:
    return f"<!-- result: {key} -->"


def end_marker(key: str) -> str:
    return f"<!-- /result: {key} -->"


def section(result: Result) -> str:
    """The markdown of one result, markers included."""
    lines = [
        start_marker(result.key),
        f"## {result.title}",
        "",
        f"`{result.command}` on {result.machine}; tree {result.tree}, {result.date}.",
    ]
    if result.notes:
        lines += ["", *(f"- {note}" for note in result.notes)]
    for item in result.tables:
        lines += ["", *([item.title, ""] if item.title else []), item.markdown()]
    return "\n".join([*lines, end_marker(result.key)])


def render_text(text: str, results: Iterable[Result]) -> str:
    """``text`` with every result's section replaced (or appended)."""
    for result in results:
        start, end = start_marker(result.key), end_marker(result.key)
        if start in text and end in text:
            head, _, rest = text.partition(start)
            _, _, tail = rest.partition(end)
            text = head + section(result) + tail
        else:
            text = text.rstrip("\n") + "\n\n" + section(result) + "\n"
    return text


def render(folder: Path = RESULTS, root: Path = ROOT) -> list[Path]:
    """Rewrite every doc the stored results name; the docs written."""
    by_doc: dict[str, list[Result]] = {}
    for result in load_results(folder):
        by_doc.setdefault(result.doc, []).append(result)
    written = []
    for doc, results in sorted(by_doc.items()):
        path = root / doc
        old = path.read_text() if path.exists() else f"# {path.stem.title()}\n"
        new = render_text(old, results)
        if new != old:
            path.write_text(new)
            written.append(path)
    return written
