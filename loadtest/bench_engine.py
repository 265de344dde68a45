"""RFC-008's workload on the engine: multi-item against its own single-item path and
transformers, side by side in one run on the same CPU and weights, timed in turn.

For N items behind a 300-token query (10-token items), with the replica settings of the
shipped serve_config.yaml (query cache off), two presets of one measurement:

- ``engine``: the real SmolLM2-135M-Instruct; the single-item, shared-prefix and
  packed-reference layouts, this machine's float32 matmul peak and the padding;
- ``families``: a catalog model's shape (Gemma-3-1B by default) with random weights (a
  transformers model saved with save_pretrained and loaded by scorejax); single-item and
  shared-prefix.

    python -m loadtest run engine [--items 1,10,100] [--repeats 3] [--no-hf]
    python -m loadtest run families [--model Gemma-3-1B] [--items 10,100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest import bench_common as common
from loadtest import peers
from loadtest.harness import (
    MODEL,
    Option,
    Result,
    Run,
    Workload,
    col,
    counts,
    ratio,
    table,
    timed_together,
)
from replicas.model.catalog import HF_CONFIGS

LAYOUTS = ("single", "shared_prefix", "packed_reference")


def layouts(shipped: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The settings of each layout ``names`` asks for."""
    every = {
        "single": shipped.replace(multi_item_scoring_delimiter=None),
        "shared_prefix": shipped,
        "packed_reference": shipped.replace(layout="packed_reference"),
    }
    return {name: every[name] for name in names}


def baseline(work: Any, hf_model: Any) -> dict[str, Callable[[], Any]]:
    """transformers' batched single-item scoring of ``work`` (none without ``hf_model``)."""
    return {} if hf_model is None else {"transformers": peers.hf_scorer(work, hf_model)}


ENGINE_COLUMNS = (
    col("items", "d"), col("single-item s", ".3f"), col("shared-prefix s", ".3f"),
    col("packed-reference s", ".3f"), col("transformers s", ".3f"),
    col("speed-up vs single", ".1f", "x"), col("speed-up vs transformers", ".1f", "x"),
    col("reference speed-up", ".1f", "x"), col("model FLOP/s / peak", ".0%"),
    col("padding", ".2f"), col("max abs diff multi vs single", ".1e"),
    col("max abs diff vs transformers", ".1e"),
)  # fmt: skip


def engine_row(
    n: int, o: argparse.Namespace, built: dict, hf: Any, config: Any, peak: float
) -> tuple:
    """One row of the shipped model: every layout, transformers, FLOP/s and padding."""
    from replicas.model.flops import multi_item_flops

    work = common.make_work(n, o.query_tokens, o.item_tokens)
    rounds = 1 if n >= 100 else o.repeats
    counters = lambda: built["shared_prefix"].stats().as_dict()  # noqa: E731
    calls = {**common.contenders(built, [work]), **baseline(work, hf)}
    seconds = timed_together(calls, rounds, counters=counters)
    padding = seconds.moved["computed_tokens"] / seconds.moved["useful_tokens"]
    hf_s, scores = seconds.get("transformers"), seconds.last
    single, multi, packed = (seconds[k] for k in LAYOUTS)
    flops = multi_item_flops(config, o.query_tokens, [o.item_tokens] * n)
    return (n, single, multi, packed, hf_s, single / multi, ratio(hf_s, multi), single / packed,
            flops / multi / peak, padding, common.diff(scores, "shared_prefix", "single"),
            common.diff(scores, "transformers", "single"))  # fmt: skip


def measure_engine(o: argparse.Namespace, run: Run) -> list[Result]:
    import jax

    shipped = common.shipped_settings()
    built, loaded = common.build_engines(shipped, layouts(shipped, LAYOUTS), MODEL)
    peak = common.matmul_peak_flops()
    hf = peers.load_hf_model() if o.hf else None
    rows = []
    for n in counts(o.items):
        rows.append(engine_row(n, o, built, hf, loaded.config, peak))
        run.say(f"{n} items: {rows[-1][1:4]}")
    notes = (
        f"jax {jax.__version__} on {jax.devices()[0].platform}; {MODEL} (GGUF Q4_1 "
        "dequantized to float32), the replica settings of `serve_config.yaml`, query cache off",
        f"request: {o.query_tokens}-token query, {o.item_tokens}-token items, 3 labels; median "
        f"of {o.repeats} rounds, each timing every layout and transformers once in turn, once "
        "the request's own signature is compiled (1 round at >= 100 items)",
        f"measured float32 matmul peak (XLA, best of 512..2048 square): {peak / 1e9:.0f} GFLOP/s",
        "model FLOP/s: analytic FLOPs of the useful multi-item work over the shared-prefix "
        "time; padding: tokens computed / useful tokens of the shared-prefix layout; "
        "transformers: fp32, batched rows, `logits_to_keep=1`",
    )
    title = "Engine, shipped serve_config.yaml settings"
    return [run.result(title, [table(ENGINE_COLUMNS, rows)], notes=notes, figures={"peak": peak})]


FAMILY_COLUMNS = (
    col("items", "d"), col("own single-item s", ".2f"), col("multi-item s", ".2f"),
    col("transformers s", ".2f"), col("multi vs own single", ".1f", "x"),
    col("multi vs transformers", ".1f", "x"), col("max abs diff multi vs single", ".1e"),
    col("max abs diff vs transformers", ".1e"),
)  # fmt: skip


def family_rows(o: argparse.Namespace, directory: Path, run: Run) -> list[tuple]:
    hf_model = common.random_checkpoint(directory, HF_CONFIGS[o.model])
    shipped = common.shipped_settings().replace(model=str(directory), max_multi_item_seq_len=8192)
    built, _ = common.build_engines(shipped, layouts(shipped, LAYOUTS[:2]), o.model, directory)
    rows = []
    for n in counts(o.items):
        work = common.make_work(n, o.query_tokens, o.item_tokens)
        rounds = 1 if n >= 100 else o.repeats
        hf = baseline(work, hf_model if o.hf else None)
        seconds = timed_together({**common.contenders(built, [work]), **hf}, rounds)
        scores = seconds.last
        single, multi = seconds["single"], seconds["shared_prefix"]
        hf_s = seconds.get("transformers")
        rows.append((n, single, multi, hf_s, single / multi, ratio(hf_s, multi),
                     common.diff(scores, "shared_prefix", "single"),
                     common.diff(scores, "transformers", "single")))  # fmt: skip
        run.say(f"{n} items: {rows[-1]}")
    return rows


def measure_family(o: argparse.Namespace, run: Run) -> list[Result]:
    import jax

    with tempfile.TemporaryDirectory(prefix="bench-families-") as directory:
        rows = family_rows(o, Path(directory), run)
    notes = (
        f"{o.model}'s shape with random weights, float32, the replica settings of "
        "`serve_config.yaml` (query cache off); RFC-008's workload; single-item: the engine's "
        f"own per-item path; transformers: `AutoModelForCausalLM` of {o.model}, fp32, batched "
        f"rows, `logits_to_keep=1`, same weights; median of {o.repeats} rounds, each timing "
        "every contender once in turn (1 round at >= 100 items)",
        f"jax {jax.__version__} on {jax.devices()[0].platform}",
    )
    tables = [table(FAMILY_COLUMNS, rows)]
    return [run.result(f"{o.model} (random weights), engine", tables, key=f"families-{o.model}",
                       notes=notes)]  # fmt: skip


COMMON = (
    Option("--query-tokens", 300), Option("--item-tokens", 10), Option("--repeats", 3),
    Option("--no-hf", True, "skip the transformers baseline"),
)  # fmt: skip
WORKLOAD = Workload(options=(Option("--items", "1,10,100"), *COMMON), measure=measure_engine)
FAMILIES = replace(
    WORKLOAD,
    options=(Option("--model", "Gemma-3-1B", choices=tuple(sorted(HF_CONFIGS))),
             Option("--items", "10"), *COMMON),
    measure=measure_family,
)  # fmt: skip
PRESETS = {"families": FAMILIES}
