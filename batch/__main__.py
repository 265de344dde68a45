"""``python -m batch score|rerank|loglik|classify|embed --input PATH --output DIR ...``: score
a dataset as /v1/score (/v1/rerank, /v1/completions with echo, /v1/classify,
/v1/embeddings) answers each row (docs/batch.md); prints the job's summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from batch.classify_stage import ClassifyColumns
from batch.embed_stage import EmbedColumns, embed_dataset
from batch.loglik_stage import LoglikColumns
from batch.pipeline import (
    FORMATS,
    EngineOptions,
    Job,
    classify_dataset,
    loglik_dataset,
    rerank_dataset,
    run_score_job,
    settings_from_config,
)
from batch.rerank_stage import RerankColumns
from batch.rows import ScoreColumns
from batch.summary import Summary
from replicas.checkpoints.sources import resolve_model_source
from replicas.settings import ReplicaSettings, SettingsError


def token_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated token ids, got {text!r}") from None


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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m batch", description=__doc__)
    modes = top.add_subparsers(dest="mode", required=True)
    score = modes.add_parser("score", help="label-token scores of each row, as /v1/score")
    _common(score)
    score.add_argument("--query-column", default="query")
    score.add_argument("--labels", required=True, type=token_ids, help="label token ids")
    score.add_argument("--item-column", default="item")
    score.add_argument("--apply-softmax", action="store_true")
    score.add_argument("--item-first", action="store_true")
    rerank = modes.add_parser("rerank", help="each (query, document) row's relevance")
    _common(rerank)
    rerank.add_argument("--query-column", default="query")
    rerank.add_argument("--document-column", default="document")
    loglik = modes.add_parser("loglik", help="lm-eval loglikelihood of each row's continuation")
    _common(loglik)
    loglik.add_argument("--context-column", default="context")
    loglik.add_argument("--continuation-column", default="continuation")
    classify = modes.add_parser("classify", help="each row's label and probs, as /v1/classify")
    _common(classify)
    classify.add_argument("--input-column", default="input")
    classify.add_argument("--no-activation", action="store_true", help="the raw head outputs")
    embed = modes.add_parser("embed", help="each row's vector, as /v1/embeddings")
    _common(embed)
    embed.add_argument("--input-column", default="text")
    embed.add_argument("--prompt-name", default=None, help="one of the model's prompts")
    embed.add_argument("--dimensions", type=int, default=None, help="Matryoshka: first d")
    return top


def _run(args: argparse.Namespace, settings: ReplicaSettings) -> Summary:
    keep = None if args.keep is None else [c for c in args.keep.split(",") if c]
    job = Job(args.input, args.output, args.output_format, args.input_format, args.checkpoint)
    options = EngineOptions(
        replicas=args.replicas,
        batch_size=args.batch_size,
        engine=args.engine,
        app=args.app,
        max_in_flight=args.max_in_flight,
        group=not args.no_group,
        adapter=adapter_of(args.model, settings),
    )
    if args.mode == "rerank":
        columns = RerankColumns(args.query_column, args.document_column, args.id_column)

        def ranked(ds: Any, tally: Any) -> Any:
            return rerank_dataset(ds, settings, columns, options, keep, tally)

        return job.run(ranked, args.id_column)
    if args.mode == "embed":
        texts = EmbedColumns(args.input_column, args.id_column, args.prompt_name, args.dimensions)

        def embedded(ds: Any, tally: Any) -> Any:
            return embed_dataset(ds, settings, texts, options, keep, tally)

        return job.run(embedded, args.id_column)
    if args.mode == "classify":
        texts = ClassifyColumns(args.input_column, args.id_column, not args.no_activation)

        def classified(ds: Any, tally: Any) -> Any:
            return classify_dataset(ds, settings, texts, options, keep, tally)

        return job.run(classified, args.id_column)
    if args.mode == "loglik":
        pairs = LoglikColumns(args.context_column, args.continuation_column, args.id_column)

        def scored(ds: Any, tally: Any) -> Any:
            return loglik_dataset(ds, settings, pairs, options, keep, tally)

        return job.run(scored, args.id_column)
    score_columns = ScoreColumns(
        label_token_ids=args.labels,
        query=args.query_column,
        item=args.item_column,
        id=args.id_column,
        apply_softmax=args.apply_softmax,
        item_first=args.item_first,
        model=options.adapter,
    )
    return run_score_job(
        args.input,
        args.output,
        settings,
        score_columns,
        options,
        args.output_format,
        keep,
        args.checkpoint,
        args.input_format,
    )


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


def main(argv: list[str] | None = None) -> int:
    import ray

    args = parser().parse_args(argv)
    try:
        settings = settings_from_config(args.config)
    except (SettingsError, OSError) as error:
        print(f"python -m batch: {error}", file=sys.stderr)
        return 2
    if not ray.is_initialized():  # batch.__main__.main from a driver that has a cluster
        ray.init(address=args.address, log_to_driver=False)
    try:
        summary = _run(args, settings)
    except SettingsError as error:  # an option the job refuses before it starts
        print(f"python -m batch: {error}", file=sys.stderr)
        return 2
    print(summary.line())
    print(json.dumps(summary.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
