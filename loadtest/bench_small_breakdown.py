"""Benchmark: where a small request's time goes (issue 61, item 1).

    python -m loadtest run small_breakdown [--repeats 30] [--profiled 20]

SmolLM2-135M-Instruct on the shipped serve_config.yaml settings (float32, this CPU), the
``small`` workload's request: a 9-token query, items ``""`` and ``" not"``, 3 labels, one
fused step of 16 tokens. Three views, all in this process:

1. The host: ``score_batch`` cut by ``time.perf_counter`` marks (the fused layout's ``_run``
   entered, and a copy of ``run_device`` that marks placement, the executable's call, its
   wait and the copy of its result to the host), medians of ``--repeats``; beside it the
   same call unmarked, in turn.
2. The executable's ops: a ``jax.profiler`` trace of ``--profiled`` calls on arguments
   already placed, each op's exclusive time by kind (loadtest.xla_profile); beside it the
   executable's untraced median, since tracing adds a little to every op.
3. Pieces jitted alone, timed in turn with the executable: the 30-layer stack (and 1 layer:
   what a layer costs), the LM head as the step runs it (one chunk of the step's 16 score rows) and
   over the 2 real rows only.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from functools import partial
from typing import Any

import numpy as np

from loadtest.bench_small_report import breakdown_tables
from loadtest.harness import Option, Result, Run, Workload, timed_together


def host_phases(engine: Any, params: Any, work: Any, repeats: int) -> tuple[dict, tuple]:
    """Median seconds of each phase of ``score_batch([work])``; and the fused call's
    (executable, placed arguments)."""
    import jax

    from replicas.engine.scoring_engine import place

    now, marks, seen = time.perf_counter, {}, {}
    fused = engine._multi.fused  # the shared-prefix layout's fused layout
    run = fused._run

    def marked_run(*args: Any) -> Any:
        marks["pack"] = now()
        return run(*args)

    def marked_device(kind: str, dims: Any, args: tuple) -> np.ndarray:
        marks["place"] = now()
        executable = engine._compiler.executable(kind, dims)  # as run_device
        (_, *shardings), _ = executable.input_shardings
        fallback = engine.placement.replicated
        placed = jax.tree.map(partial(place, fallback=fallback), args, tuple(shardings))
        marks["call"] = now()
        out = executable(params, *placed)
        marks["wait"] = now()
        out.block_until_ready()
        marks["copy"] = now()
        host = np.asarray(out)
        marks["unpack"] = now()
        seen["call"] = (executable, placed)
        return host

    names = ["start", "pack", "place", "call", "wait", "copy", "unpack", "end"]
    marked_s: dict[str, list[float]] = {k: [] for k in names[:-1]}

    def marked() -> None:
        fused._run, engine.run_device = marked_run, marked_device
        try:
            marks["start"] = now()
            engine.score_batch([work])
            marks["end"] = now()
        finally:
            del fused._run, engine.run_device  # the methods again
        for first, second in itertools.pairwise(names):
            marked_s[first].append(marks[second] - marks[first])

    def executable() -> None:  # alone, its arguments placed
        call, placed = seen["call"]
        call(params, *placed).block_until_ready()

    calls = {"marked": marked, "unmarked": partial(engine.score_batch, [work]),
             "executable": executable}  # fmt: skip
    timings = timed_together(calls, repeats, warm=2)  # in turn
    phases = {name: statistics.median(values[2:]) for name, values in marked_s.items()}
    return phases | {k: timings[k] for k in ("unmarked", "executable")}, seen["call"]


def pieces(engine: Any, params: Any, call: tuple, repeats: int) -> dict[str, float]:
    """Median seconds of the executable and of pieces of it jitted alone, in turn."""
    import jax

    from replicas.engine.layouts.common import grouped, score_rows
    from replicas.model.causal_lm import AttentionSpec
    from replicas.model.layer_loop import UNROLLED
    from replicas.model.masks import work_segment_mask

    model, (executable, placed) = engine.model, call
    tokens, positions, segments, owners, rows, labels, count = placed
    inputs = (tokens, positions, segments, owners)  # arguments, never constants to fold

    def stack(p: Any, tokens: Any, positions: Any, segments: Any, owners: Any) -> Any:
        spec = AttentionSpec(work_segment_mask(owners, segments))
        return model.hidden_states(p, tokens, positions, spec)

    def head(p: Any, h: Any, rows: Any, labels: Any, count: Any) -> Any:
        return score_rows(model, p, grouped(h, 1), rows, labels, count)

    layers = jax.jit(stack)
    one = {**params, "layers": jax.tree.map(lambda leaf: leaf[:1], params["layers"])}
    if UNROLLED in params:  # the small step's per-layer copy, cut to its first layer too
        one[UNROLLED] = params[UNROLLED][:1]
    hidden = layers(params, *inputs)
    real_rows = np.asarray(rows)[0, : int(count)]  # the 2 items' hidden states
    real = hidden.reshape(-1, hidden.shape[-1])[real_rows]
    real_labels = labels[0, : len(real_rows)]
    heads, real_head = jax.jit(head), jax.jit(model.label_logprobs)
    return timed_together({
        "executable": lambda: executable(params, *placed).block_until_ready(),
        "stack": lambda: layers(params, *inputs).block_until_ready(),
        "stack_1": lambda: layers(one, *inputs).block_until_ready(),
        "head": lambda: heads(params, hidden, rows, labels, count).block_until_ready(),
        "head_real": lambda: real_head(params, real, real_labels).block_until_ready(),
    }, repeats, warm=2)  # fmt: skip


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    from loadtest.bench_small import engine_for, shipped_small
    from loadtest.xla_profile import Classifier, profile_by_kind

    settings, loaded, work = shipped_small()
    engine = engine_for(loaded, settings)
    params = engine.params  # as the executables take them (the layer loop's form)
    engine.score_batch([work])
    (kind, dims), *_ = engine.last_signatures
    run.say(f"host phases ({kind} {dims})")
    phases, call = host_phases(engine, params, work, o.repeats)
    run.say("the executable's ops, traced")
    executable, placed = call
    classifier = Classifier(executable.as_text(), loaded.model.config.vocab_size)
    by_kind, counts, ops = profile_by_kind(
        lambda: executable(params, *placed).block_until_ready(), classifier, o.profiled
    )
    run.say("pieces jitted alone")
    parts = pieces(engine, params, call, o.repeats)
    figures = {"dims": str(dims), "phases": phases, "by_kind": by_kind, "counts": counts,
               "pieces": parts, "ops": ops[:40]}  # fmt: skip
    notes, tables = breakdown_tables(figures, o)
    title = "Where a small request's step goes (issue 61)"
    return [run.result(title, tables, key="small-breakdown", notes=notes, figures=figures)]


WORKLOAD = Workload(
    options=(Option("--repeats", 30), Option("--profiled", 20, "calls traced")),
    measure=measure,
)
