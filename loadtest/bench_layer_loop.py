"""Benchmark: the decoder's layer loop, ``layer_loop: scan`` against ``unrolled`` and ``auto``
(issue 61).

    python -m loadtest run layer_loop [--repeats 16]

SmolLM2-135M-Instruct on the shipped serve_config.yaml settings (float32, this CPU), one engine
per loop over the same loaded weights: each engine's warm-up (the shipped warm-up shapes,
compiled from an empty cache in this process), then fused steps of one work filling 16..256
tokens (the small request's 16), the engines in turn each round (shuffled), and whether
their scores are bit-identical.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import numpy as np

from loadtest.harness import Option, Result, Run, Workload, col, table, timed_once, timed_together

WIDTHS = (16, 32, 64, 128, 256)
LOOPS = ("scan", "unrolled", "auto")


def warmed(loaded: Any, settings: Any) -> Any:
    from loadtest.bench_small import engine_for

    engine = engine_for(loaded, settings)
    engine.warmup()
    return engine


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    from loadtest.bench_small import shipped_small
    from loadtest.harness import LABELS
    from replicas.contract import ScoreWork
    from replicas.model.layer_loop import SMALL_STEP_TOKENS

    settings, loaded, small = shipped_small()
    engines, warm = {}, {}
    for loop in LOOPS:
        run.say(f"warm-up, layer_loop: {loop}")
        seconds, engines[loop] = timed_once(
            partial(warmed, loaded, settings.replace(layer_loop=loop))
        )
        warm[loop] = (seconds, engines[loop].compile_count)
    rows, identical = [], True
    for width in WIDTHS:
        run.say(f"fused steps of {width} tokens")
        work = small if width == 16 else ScoreWork((100,) * (width - 2), ((200,), (300,)), LABELS)
        calls = {loop: (lambda e=engines[loop], w=work: e.score_batch([w])) for loop in LOOPS}
        times = timed_together(calls, o.repeats, warm=2, shuffle=True)
        first, *others = times.last.values()
        for scores in others:
            identical &= all(np.array_equal(a, b) for a, b in zip(first, scores, strict=True))
        steps = [times[loop] for loop in LOOPS]
        rows.append((width, *steps, *(steps[0] / t for t in steps[1:])))
    columns = [col("fused step tokens"), *(col(f"{loop} s", ".4f") for loop in LOOPS),
               *(col(f"scan / {loop}", ".2f", "x") for loop in LOOPS[1:])]  # fmt: skip
    warm_rows = [(loop, seconds, count) for loop, (seconds, count) in warm.items()]
    tables = [
        table(columns, rows, title="Steps, medians in turn"),
        table(
            [col("layer_loop", left=True), col("warm-up s", ".1f"), col("executables")],
            warm_rows,
            title="Warm-up from an empty cache",
        ),
    ]
    notes = [
        f"shipped serve_config.yaml settings (SmolLM2-135M-Instruct, float32), `layer_loop` "
        f"the only difference; medians of {o.repeats} shuffled rounds",
        f"auto: steps of at most {SMALL_STEP_TOKENS} tokens unrolled over a per-layer copy of "
        "the stack, larger ones scanning the stack",
        "scores bit-identical between the loops: " + ("yes" if identical else "NO"),
    ]
    figures = {"steps": rows, "warmup": warm, "identical": identical}
    title = "The layer loop: scanned stack, one array per layer, unrolled in small steps (issue 61)"
    return [run.result(title, tables, key="layer-loop", notes=notes, figures=figures)]


WORKLOAD = Workload(options=(Option("--repeats", 16),), measure=measure)
