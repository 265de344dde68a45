"""The one runner every benchmark goes through (``python -m loadtest run NAME``).

A benchmark is a declared :class:`Workload`: its options, and ``measure``, which runs the
workload beside its baselines and returns :class:`Result` s. The runner here gives each the
same pieces: the machine's description, the tree (git commit), timing in turn
(:func:`timed_together`), warm-up, progress lines, and one
result schema, stored as JSON under docs/results/ and rendered into the docs by
``python -m loadtest render`` (loadtest.render). Imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"  # rendered into the docs
TOOL_RESULTS = ROOT / "loadtest" / "results"  # a tool's runs (git-ignored)
BENCHMARKS_DOC = "docs/benchmarks.md"
MODEL = "SmolLM2-135M-Instruct"
LABELS = (7042, 4528, 11452)  # " Paris", " London", " Berlin"
JSON_HEADERS = {"content-type": "application/json"}


@dataclass(frozen=True)
class Column:
    """A table column: its heading and how a figure in it is written (a format spec and a
    suffix such as ``x``); ``left``: left-aligned text."""

    label: str
    format: str = ""
    suffix: str = ""
    left: bool = False

    def cell(self, value: Any, missing: str) -> str:
        if value is None:
            return missing
        if isinstance(value, str) or not self.format:
            return str(value).replace("|", "/")
        if self.format.endswith("d"):  # a count read from float counters
            value = round(value)
        return format(value, self.format) + self.suffix


def col(label: str, fmt: str = "", suffix: str = "", left: bool = False) -> Column:
    return Column(label, fmt, suffix, left)


def shown(value: Any, fmt: str, suffix: str = "", missing: str = "-") -> str:
    """``value`` as a table cell of that format writes it (``missing`` when unknown)."""
    return Column("", fmt, suffix).cell(value, missing)


@dataclass(frozen=True)
class Target:
    """One goal: ``value`` held against ``limit`` (at least or at most); ``shown``: as text."""

    goal: str
    value: float | None
    limit: float
    at_least: bool
    shown: str

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not measured"
        met = self.value >= self.limit if self.at_least else self.value <= self.limit
        return "met" if met else "missed"


def targets_table(targets: Sequence[Target]) -> Table:
    """The goals: goal, measured, met/missed."""
    rows = [(t.goal, t.shown, t.verdict) for t in targets]
    return table([col("target", left=True), col("measured", left=True), col("", left=True)], rows)


@dataclass(frozen=True)
class Table:
    """One table of a result: columns and rows of figures (None: not measured)."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[Any, ...], ...]
    title: str = ""
    missing: str = "-"

    def markdown(self) -> str:
        head = "| " + " | ".join(c.label for c in self.columns) + " |"
        rule = "|" + "".join("---|" if c.left else "---:|" for c in self.columns)
        body = [
            "| "
            + " | ".join(c.cell(v, self.missing) for c, v in zip(self.columns, row, strict=True))
            + " |"
            for row in self.rows
        ]
        return "\n".join([head, rule, *body])

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        columns = tuple(Column(**c) for c in data["columns"])
        rows = tuple(tuple(row) for row in data["rows"])
        return cls(columns, rows, data.get("title", ""), data.get("missing", "-"))


def table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], **kw: Any) -> Table:
    return Table(tuple(columns), tuple(tuple(r) for r in rows), **kw)


def figures_table(figures: Mapping[str, Any]) -> Table:
    """A tool's figures, one a row (nested ones as JSON)."""
    show = lambda v: v if isinstance(v, str) else json.dumps(v, default=str)  # noqa: E731
    rows = [(k, show(v)) for k, v in figures.items()]
    return table([col("figure", left=True), col("value", left=True)], rows)


@dataclass(frozen=True)
class Result:
    """What one run measured and how: the file docs/results/<key>.json holds one.

    ``key``: the benchmark and its variant (the newest result per key is kept); ``notes``:
    what was run and how, one bullet each; ``figures``: raw figures beside the tables'."""

    key: str
    workload: str
    title: str
    machine: str
    tree: str
    date: str
    command: str
    settings: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict)
    doc: str = BENCHMARKS_DOC

    def to_json(self) -> str:
        data = asdict(replace(self, figures=_data(self.figures)))
        return json.dumps(data, indent=1, default=_plain) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Result:
        data = json.loads(text)
        data["notes"] = tuple(data.get("notes", ()))
        data["tables"] = tuple(Table.from_json(t) for t in data.get("tables", ()))
        return cls(**data)

    def save(self, folder: Path = RESULTS) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.key}.json"
        path.write_text(self.to_json())
        return path


def _data(value: Any) -> Any:
    """``value`` with every :class:`Timings` in it as its medians (the figures' JSON)."""
    if isinstance(value, Mapping):
        return {k: _data(v) for k, v in value.items()}
    return [_data(v) for v in value] if isinstance(value, list | tuple) else value


def _plain(value: Any) -> Any:
    """numpy scalars as numbers, anything else JSON cannot hold as its text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def load_results(folder: Path = RESULTS) -> list[Result]:
    return [Result.from_json(p.read_text()) for p in sorted(folder.glob("*.json"))]


@dataclass(frozen=True)
class Option:
    """A command-line option of a workload: ``--flag`` and its default (its type too)."""

    flag: str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if isinstance(self.default, bool):  # --no-hf: the dest ``hf``, True unless given
            action = "store_false" if self.default else "store_true"
            dest = self.flag.removeprefix("--no-" if self.default else "--").replace("-", "_")
            parser.add_argument(self.flag, action=action, dest=dest, help=self.help)
            return
        kind = type(self.default) if self.default is not None else str
        parser.add_argument(
            self.flag, type=kind, default=self.default, help=self.help, choices=self.choices
        )


@dataclass(frozen=True)
class Workload:
    """A benchmark or tool as the runner knows it. ``measure(options, run)`` returns the
    results of a declared benchmark; a tool with flags of its own has ``main(argv)``."""

    options: tuple[Option, ...] = ()
    measure: Callable[[argparse.Namespace, Run], Sequence[Result]] | None = None
    main: Callable[[list[str]], int] | None = None
    url: bool = False  # takes --url (a running server)
    out: Path = RESULTS  # where its results go by default
    name: str = ""  # both set by the registry (loadtest.workloads)
    summary: str = ""


def counts(text: str) -> list[int]:
    """``"1,10,100"`` -> ``[1, 10, 100]``."""
    return [int(n) for n in str(text).split(",") if n.strip()]


def loopback_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError unless it is http(s) to a loopback host."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if parsed.scheme not in ("http", "https") or not _is_loopback(host):
        raise ValueError(f"{url!r} is not an http(s) URL of a loopback address")
    return url.rstrip("/")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> str:
    """``<cpu model>, <n> cores``."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def tree() -> str:
    """The git commit of the tree that runs (``-dirty`` when it has uncommitted changes)."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], capture_output=True, text=True, cwd=ROOT)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--short", "--untracked-files=no") else "")


class Run:
    """One run of a workload: its options, the clock for progress, and its results' shape."""

    def __init__(self, workload: Workload, options: argparse.Namespace, argv: Sequence[str]):
        self.workload, self.options = workload, options
        shown = [a for a, b in zip(argv, ["", *argv], strict=False) if "--out" not in (a, b)]
        self.command = shlex.join(["python", "-m", "loadtest", "run", workload.name, *shown])
        self.start = time.perf_counter()
        self.load_before = os.getloadavg()
        self.tree = tree()  # at the start: the tree may change while the run goes on

    def say(self, message: str) -> None:
        """A progress line, with the seconds since the run started."""
        print(f"[{time.perf_counter() - self.start:7.0f} s] {message}", flush=True)

    def result(self, title: str, tables: Sequence[Table], key: str = "", **kw: Any) -> Result:
        """A result of this run: machine, tree, date, command and settings filled in."""
        settings = {k: v for k, v in vars(self.options).items() if k != "out"}
        one, *_ = os.getloadavg()
        kw.setdefault("machine", machine_description())
        notes = (*kw.pop("notes", ()), f"1-minute load average {self.load_before[0]:.1f} "
                 f"before, {one:.1f} after")  # fmt: skip
        return Result(
            key=key or self.workload.name, workload=self.workload.name, title=title,
            tree=self.tree, date=time.strftime("%Y-%m-%d"), command=self.command,
            settings=settings, notes=notes, tables=tuple(tables), **kw,
        )  # fmt: skip


@dataclass(frozen=True, repr=False)
class Timings(Mapping[str, float]):
    """What :func:`timed_together` measured: each contender's wall seconds, a sample a round;
    its last answer; the 1-minute load average before and after the rounds; how far
    ``counters`` moved over them. As a mapping: each contender's median seconds."""

    samples: Mapping[str, tuple[float, ...]]
    last: Mapping[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    moved: Mapping[str, float] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return repr(dict(self))

    def spread(self, name: str) -> tuple[float, float]:
        """The interquartile range of ``name``'s samples (lower, upper quartile)."""
        values = self.samples[name]
        if len(values) < 2:
            return values[0], values[0]
        low, _, high = statistics.quantiles(values, n=4, method="inclusive")
        return low, high

    def best(self, name: str) -> float:
        return min(self.samples[name])


def timed_together(
    calls: Mapping[str, Callable[[], object]],
    repeats: int,
    warm: int = 1,
    shuffle: bool = False,
    pause_s: float = 0.0,
    counters: Callable[[], Mapping[str, Any]] | None = None,
) -> Timings:
    """The one timer of every benchmark: ``repeats`` rounds that run every call once in turn
    (after ``warm`` untimed rounds), so a machine whose speed drifts during the run slows
    every call alike and their ratios hold. ``shuffle``: each round runs the calls in its own
    order (seeded by the round), so no call always follows the same one (a call can slow the
    next: docs/quantization.md). ``pause_s``: idle seconds before each timed call, untimed.
    ``counters``: read before and after the timed rounds (``Timings.moved``)."""
    for _ in range(warm):
        for fn in calls.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    answers: dict[str, Any] = {}
    names, load, before = list(calls), os.getloadavg()[0], counters() if counters else {}
    for r in range(repeats):
        for name in random.Random(r).sample(names, len(names)) if shuffle else names:
            time.sleep(pause_s)
            start = time.perf_counter()
            answers[name] = calls[name]()
            samples[name].append(time.perf_counter() - start)
    moved = grown(before, counters()) if counters else {}
    frozen = {name: tuple(values) for name, values in samples.items()}
    return Timings(frozen, answers, (load, os.getloadavg()[0]), moved)


def timed(fn: Callable[[], object], repeats: int, warm: int = 1) -> float:
    """Median wall seconds of ``repeats`` calls after ``warm`` untimed ones (timed_together
    of one call)."""
    return timed_together({"fn": fn}, repeats, warm)["fn"]


def timed_once(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds and answer of one call (timed_together of one round, no warm-up)."""
    timings = timed_together({"fn": fn}, 1, warm=0)
    return timings["fn"], timings.last["fn"]


def grown(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
    """``after - before`` of every numeric counter both hold (the growth of a server's or an
    engine's counters around a run)."""
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
    return {k: after[k] - v for k, v in before.items() if number(v) and number(after.get(k))}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; None when either is unknown or the denominator is <= 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def parser_for(workload: Workload) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m loadtest run {workload.name}", description=workload.summary
    )
    if workload.url:
        parser.add_argument("--url", default=None, help="a running server (loopback)")
    for option in workload.options:
        option.add_to(parser)
    parser.add_argument("--out", type=Path, default=workload.out, help="folder for the results")
    return parser


def run_workload(workload: Workload, argv: Sequence[str]) -> int:
    """Parse ``argv`` for ``workload``, measure, store every result; a tool runs its main."""
    if workload.main is not None:
        return workload.main(list(argv))
    assert workload.measure is not None
    options = parser_for(workload).parse_args(list(argv))
    if getattr(options, "url", None):
        try:
            options.url = loopback_url(options.url)
        except ValueError as error:
            parser_for(workload).error(f"--url: {error}")
    run = Run(workload, options, argv)
    results = workload.measure(options, run)
    for result in results:
        for item in result.tables:
            print(("\n" + item.title if item.title else "") + "\n" + item.markdown(), flush=True)
        run.say(f"wrote {result.save(options.out)}")
    return 1 if any(result.figures.get("failed") for result in results) else 0
