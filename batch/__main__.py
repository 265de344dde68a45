"""``python -m batch score|rerank|loglik|classify|embed --input PATH --output DIR ...``: score
a dataset as /v1/score (/v1/rerank, /v1/completions with echo, /v1/classify,
/v1/embeddings) answers each row (docs/batch.md); prints the job's summary. One subcommand
per mode of batch.modes.MODES."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from batch.job import FORMATS, Job
from batch.modes import MODES, BatchMode, mode_named
from batch.pipeline import EngineOptions, mode_dataset, settings_from_config
from batch.summary import Summary
from replicas.checkpoints.sources import resolve_model_source
from replicas.settings import ReplicaSettings, SettingsError


def _common(mode: argparse.ArgumentParser) -> None:
    mode.add_argument("--input", required=True, help="a JSONL, Parquet or CSV file or folder")
    mode.add_argument("--output", required=True, help="a folder the output files go into")
    mode.add_argument("--id-column", default="id")
    mode.add_argument("--keep", default=None, help="input columns to keep (default: all)")
    mode.add_argument("--config", type=Path, default=None, help="serve config (shipped one)")
    mode.add_argument("--input-format", choices=FORMATS, default=None, help="default: suffix")
    mode.add_argument("--output-format", choices=FORMATS, default="parquet")
    mode.add_argument("--replicas", type=int, default=1, help="engine actors (serve: callers)")
    mode.add_argument("--batch-size", type=int, default=512, help="rows per engine call")
    mode.add_argument("--checkpoint", default=None, help="resume folder (Ray Data checkpoints)")
    mode.add_argument("--address", default=None, help="Ray cluster (default: RAY_ADDRESS/local)")
    mode.add_argument("--engine", choices=("local", "serve"), default="local")
    mode.add_argument("--app", default="scorejax", help="--engine serve: the Serve app")
    mode.add_argument(
        "--max-in-flight", type=int, default=4, help="--engine serve: calls per caller actor"
    )
    mode.add_argument(
        "--no-group", action="store_true", help="input already grouped by query: no shuffle"
    )
    help_text = "a LoRA adapter of the config's lora_adapters every row runs with (or the base)"
    mode.add_argument("--model", default=None, help=help_text)


def parser(modes: tuple[BatchMode, ...] = MODES) -> argparse.ArgumentParser:
    """The command: one subcommand per mode of ``modes`` (batch.modes), the common
    arguments and the mode's own."""
    top = argparse.ArgumentParser(prog="python -m batch", description=__doc__)
    commands = top.add_subparsers(dest="mode", required=True)
    for mode in modes:
        command = commands.add_parser(mode.name, help=mode.help)
        _common(command)
        for argument in mode.arguments:
            argument.add_to(command)
    return top


def _run(
    args: argparse.Namespace, settings: ReplicaSettings, modes: tuple[BatchMode, ...] = MODES
) -> Summary:
    """The job ``args`` describe: read, the mode's dataset, write; its summary."""
    mode = mode_named(args.mode, modes)
    keep = None if args.keep is None else [c for c in args.keep.split(",") if c]
    options = EngineOptions(
        replicas=args.replicas,
        batch_size=args.batch_size,
        engine=args.engine,
        app=args.app,
        max_in_flight=args.max_in_flight,
        group=not args.no_group,
        adapter=adapter_of(args.model, settings),
    )
    columns = mode.columns(args, options.adapter)

    def answered(ds: Any, tally: Any) -> Any:
        return mode_dataset(ds, settings, mode, columns, options, keep, tally)

    job = Job(
        args.input,
        args.output,
        args.output_format,
        args.input_format,
        args.checkpoint,
        options.cpu_share,
    )
    return job.run(answered, columns.id)


def adapter_of(model: str | None, settings: ReplicaSettings) -> str | None:
    """The LoRA adapter ``--model`` names (None: the base model, by its name or no
    ``--model``); a SettingsError when the config serves no such model."""
    adapters = [name for name, _ in settings.adapters.lora_adapters]
    if model is None or model in adapters:
        return model
    base = resolve_model_source(settings.model.name).name
    if model != base:
        served = ", ".join(repr(name) for name in (base, *adapters))
        raise SettingsError(f"--model: {model!r} is not served by this config; it serves {served}")
    return None


def main(argv: list[str] | None = None, modes: tuple[BatchMode, ...] = MODES) -> int:
    import ray

    args = parser(modes).parse_args(argv)
    try:
        settings = settings_from_config(args.config)
    except (SettingsError, OSError) as error:
        print(f"python -m batch: {error}", file=sys.stderr)
        return 2
    if not ray.is_initialized():  # batch.__main__.main from a driver that has a cluster
        ray.init(address=args.address, log_to_driver=False)
    try:
        summary = _run(args, settings, modes)
    except SettingsError as error:  # an option the job refuses before it starts
        print(f"python -m batch: {error}", file=sys.stderr)
        return 2
    print(summary.line())
    print(json.dumps(summary.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
