"""A batch job's input and output: read (Parquet, JSON lines, CSV), write, checkpoint, and
``Job.run`` (read, the mode's dataset, write, summary) that ``python -m batch`` runs.

No scheduler of our own: Ray Data streams the blocks and checkpoints written ids
(``CheckpointConfig`` on the id column); the job's counts go to a ``batch.summary.Tally``
actor on the driver's node.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from batch.grouping import shuffle_cost
from batch.summary import Summary, Tally
from replicas.settings import SettingsError

FORMATS = ("parquet", "jsonl", "csv")
TALLY_PREFIX = "scorejax-batch-tally-"  # a running job's counts actor (named: findable)


def input_format(path: str) -> str:
    """``parquet``, ``jsonl`` or ``csv`` from a path's suffix (a local folder: its files')."""
    suffixes = {Path(path).suffix}
    if not Path(path).suffix and "://" not in path and Path(path).is_dir():
        suffixes = {p.suffix for p in Path(path).iterdir()}
    for name, endings in (
        ("parquet", {".parquet"}),
        ("csv", {".csv"}),
        ("jsonl", {".jsonl", ".json"}),
    ):
        if suffixes & endings:
            return name
    raise SettingsError(
        f"--input-format: none given, and {path} has no .jsonl, .parquet or .csv files"
    )


def read_input(path: str, fmt: str | None = None, num_cpus: float = 0.25) -> ray.data.Dataset:
    """Parquet, JSON lines or CSV (``fmt``, else by suffix) from a path or URI."""
    fmt = fmt or input_format(path)
    if fmt == "parquet":
        return ray.data.read_parquet(path, num_cpus=num_cpus)
    if fmt == "csv":
        return ray.data.read_csv(path, num_cpus=num_cpus)
    if fmt == "jsonl":
        return ray.data.read_json(path, num_cpus=num_cpus)  # Arrow blocks (lines: pandas)
    raise SettingsError(f"--input-format: one of {FORMATS}, got {fmt!r}")


def _json_cells(batch: pa.Table) -> pa.Table:
    """Nested list columns as JSON text (CSV holds no lists)."""
    for name in batch.column_names:
        if pa.types.is_list(batch.schema.field(name).type):
            text = pa.array([None if v is None else json.dumps(v) for v in batch[name].to_pylist()])
            index = batch.column_names.index(name)
            batch = batch.set_column(index, name, text)
    return batch


def write_output(
    ds: ray.data.Dataset, output: str, output_format: str, num_cpus: float = 0.25
) -> ray.data.Dataset:
    """``ds`` written; the dataset that ran the write (its stats)."""
    if output_format == "parquet":
        ds.write_parquet(output, ray_remote_args={"num_cpus": num_cpus})
    elif output_format == "jsonl":
        ds.write_json(output, ray_remote_args={"num_cpus": num_cpus})
    elif output_format == "csv":
        ds = ds.map_batches(_json_cells, batch_format="pyarrow", batch_size=None, num_cpus=num_cpus)
        ds.write_csv(output, ray_remote_args={"num_cpus": num_cpus})
    else:
        raise SettingsError(f"--output-format: one of {FORMATS}, got {output_format!r}")
    return ds


def use_checkpoint(directory: str | None, id_column: str) -> None:
    """Ray Data's checkpointing on ``id_column`` under ``directory`` (None: off): rows whose
    id a write already recorded are filtered out at read, so a job run again with the same
    command computes only the rest."""
    from ray.data.checkpoint import CheckpointConfig

    context = ray.data.DataContext.get_current()
    context.checkpoint_config = (
        None
        if directory is None
        else CheckpointConfig(
            id_column, str(Path(directory).resolve()), delete_checkpoint_on_success=False
        )
    )


@dataclass(frozen=True)
class Job:
    """Where a job reads and writes, and its checkpoint folder."""

    input_path: str
    output: str
    output_format: str = "parquet"
    input_format: str | None = None
    checkpoint: str | None = None
    cpu_share: float = 0.25

    def run(self, scored: Any, id_column: str) -> Summary:
        """Read, ``scored(ds, tally)``, write; the summary."""
        use_checkpoint(self.checkpoint, id_column)
        # On the driver's node: a node lost mid-job must not take the job's counts with it.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        name = f"{TALLY_PREFIX}{uuid.uuid4().hex}"
        tally = ray.remote(Tally).options(name=name, num_cpus=0, scheduling_strategy=here).remote()
        try:  # the tally's worker process ends with the job (many jobs run from one driver)
            start = time.perf_counter()
            ds = read_input(self.input_path, self.input_format, self.cpu_share)
            out = write_output(scored(ds, tally), self.output, self.output_format, self.cpu_share)
            wall = time.perf_counter() - start
            return Summary.from_totals(ray.get(tally.totals.remote()) | shuffle_cost(out), wall)
        finally:
            ray.kill(tally)
