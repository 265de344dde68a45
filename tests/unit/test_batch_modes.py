"""The batch modes are derived from one registry (batch.modes): each is the twin of a
workload of app.workloads, the command offers exactly the registered modes, and a mode added
in the test gets its subcommand, its arguments and its pipeline (no Ray: a dataset that
records the stages it is given)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

import batch.__main__ as command
from app.workloads import WORKLOADS
from batch.grouping import GroupBy
from batch.modes import MODES, BatchMode, argument, mode_named
from batch.pipeline import EngineOptions, mode_dataset, settings_from_config
from batch.serve_stage import ServeStage
from batch.stages import EngineStage, PrepareRows, finish_rows

SETTINGS = settings_from_config()


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    (modes,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(modes.choices)


def test_every_mode_is_the_twin_of_a_workload() -> None:
    workloads = {workload.name for workload in WORKLOADS}
    names = [mode.name for mode in MODES]
    assert len(names) == len(set(names))
    for mode in MODES:
        assert mode.workload in workloads, mode.name
        assert issubclass(mode.prepare, PrepareRows), mode.name
        assert issubclass(mode.engine, EngineStage), mode.name
        assert issubclass(mode.serve, ServeStage), mode.name
        assert mode.outputs, mode.name
        assert all(helper.startswith("_sj_") for helper in mode.helpers), mode.name
    twins = {mode.name: mode.workload for mode in MODES}
    assert twins == {
        "score": "score",
        "rerank": "rerank",
        "loglik": "completions",
        "classify": "classify",
        "embed": "embeddings",
    }


def test_the_command_offers_exactly_the_registered_modes() -> None:
    assert subcommands(command.parser()) == [mode.name for mode in MODES]
    with pytest.raises(KeyError, match="batch mode"):
        mode_named("nowhere")


class Prepare(PrepareRows):
    def prepare(self, row: dict[str, Any]) -> Any:
        return row["text"]

    def helper_columns(self, prepared: list[Any]) -> dict[str, pa.Array]:
        return {"_sj_echo": pa.array(prepared, pa.string())}


class Engine(EngineStage):
    def __call__(self, batch: pa.Table) -> pa.Table:
        return batch.append_column("echo", batch.column("_sj_echo"))


class Serve(ServeStage):
    def __call__(self, batch: pa.Table) -> pa.Table:
        return batch.append_column("echo", batch.column("_sj_echo"))


@dataclass(frozen=True)
class EchoColumns:
    text: str = "text"
    id: str = "id"
    loud: bool = False


def _echo_columns(args: argparse.Namespace, adapter: str | None) -> EchoColumns:
    return EchoColumns(args.text_column, args.id_column, args.loud)


def _echo_payload(settings: Any, columns: EchoColumns) -> str:
    return f"payload of {columns.text}"


ECHO = BatchMode(
    name="echo",
    workload="score",
    help="each row's text, as it came",
    arguments=(argument("--text-column", default="text"), argument("--loud", action="store_true")),
    columns=_echo_columns,
    prepare=Prepare,
    engine=Engine,
    serve=Serve,
    payload=_echo_payload,
    outputs=("echo",),
    group=GroupBy("length"),
    helpers=("_sj_echo",),
)


@dataclass
class Recorded:
    """A dataset that records each ``map_batches`` and ``select_columns`` it is given."""

    steps: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)

    def map_batches(self, fn: Any, **kwargs: Any) -> Recorded:
        self.steps.append((fn, kwargs))
        return self

    def select_columns(self, names: list[str]) -> Recorded:
        self.steps.append(("select", {"names": names}))
        return self


def test_a_new_mode_gets_its_subcommand_and_its_pipeline(monkeypatch: Any) -> None:
    modes = (*MODES, ECHO)
    parser = command.parser(modes)
    assert subcommands(parser)[-1] == "echo"
    args = parser.parse_args(
        ["echo", "--input", "in.jsonl", "--output", "out", "--loud", "--no-group", "--keep", "x"]
    )
    assert (args.mode, args.text_column, args.loud) == ("echo", "text", True)

    ran: list[Recorded] = []

    class Job:  # the job's read and write without Ray: the dataset through the mode
        def __init__(self, *where: Any) -> None:
            self.where = where

        def run(self, answered: Any, id_column: str) -> str:
            ran.append(answered(Recorded(), "tally"))
            return id_column

    monkeypatch.setattr(command, "Job", Job)
    assert command._run(args, SETTINGS, modes) == "id"
    ((prepare, prepared), (engine, scored), (finish, finished), select) = ran[0].steps
    columns = EchoColumns("text", "id", True)
    assert (prepare, prepared["fn_constructor_args"]) == (Prepare, (SETTINGS, columns))
    payload = "payload of text"
    assert (engine, scored["fn_constructor_args"][:3]) == (Engine, (SETTINGS, payload, "tally"))
    assert finish is finish_rows
    assert finished["fn_kwargs"] == {"result": "echo", "helpers": ("_sj_echo",), "tally": "tally"}
    assert select == ("select", {"names": ["id", "x", "echo", "error", "error_message"]})

    options = EngineOptions(engine="serve", group=False, adapter="tuned", max_in_flight=3)
    served = mode_dataset(Recorded(), SETTINGS, ECHO, columns, options)
    (_, (serve, called), _) = served.steps
    assert serve is Serve
    assert called["fn_constructor_args"] == ("scorejax", SETTINGS, payload, None, 3, "tuned")


def test_a_new_modes_stages_run_on_the_skeleton() -> None:
    """The CPU stage reads rows once and writes the helpers beside ``error``; the engine
    stage's output finishes as every mode's does."""
    from tests.unit.test_app_http import SERVICE

    table = pa.table({"id": [1, 2], "text": ["a", "b"]})
    prepared = Prepare.around(SERVICE, EchoColumns())(table)
    assert prepared.column_names == ["id", "text", "_sj_echo", "error", "error_message"]
    scored = Engine.around(engine=None, payload="p")(prepared)
    out = finish_rows(scored, "echo", ECHO.helpers, None)
    assert out.to_pylist() == [
        {"id": 1, "text": "a", "error": None, "error_message": None, "echo": "a"},
        {"id": 2, "text": "b", "error": None, "error_message": None, "echo": "b"},
    ]
