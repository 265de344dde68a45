"""loadtest.bench_small's result: its tables and the notes that carry the ratios and the floor."""

from __future__ import annotations

from typing import Any

from loadtest.harness import Table, col, table
from loadtest.peers import LOGPROB_TOLERANCE, NOT_INSTALLED

NAMES = {
    "engine": "scorejax engine, one fused step (in process)",
    "served": "scorejax `/v1/score` over HTTP (`make serve`)",
    "hf_rows": "transformers, a forward per row (two passes)",
    "hf_batched": "transformers, both rows in one padded forward",
    "llama_rows": "llama.cpp (Q4_1), a row per item from an empty KV cache",
    "llama_shared": "llama.cpp (Q4_1), the query once, then each item (KV cache kept)",
}


def report(results: dict[str, Any], args: Any) -> tuple[tuple[str, ...], list[Table]]:
    """The notes and tables of one run."""
    small, served, floor = results["small"], results["served_s"], results["floor"]
    times, base = small["times"], small["times"]["hf_rows"]
    rows = dict(times, **({"served": served} if served else {}))
    notes = [
        f"shipped serve_config.yaml settings, float32; medians of {args.repeats} rounds "
        f"running every row of the small request's table once each in a shuffled order (the "
        f"served row against the running server), {args.multi_repeats} for the multi-item rows",
        f"engine / transformers' two rows: {times['engine'] / base:.2f}x (target <= 0.6x)"
        + (f"; served: {served / base:.2f}x" if served else "")
        + (
            f"; engine / llama.cpp's best: {times['engine'] / best_llama(times):.2f}x"
            if "llama_rows" in times
            else ""
        ),
        agreement(small["logprobs"]),
        floor_note(floor),
    ]
    if not results["llama"]:
        notes.append(NOT_INSTALLED)
    title = (f'A {small["query_tokens"]}-token query with 2 items (`""`, `" not"`), 3 labels, '
             "the same token ids in every row:")  # fmt: skip
    columns = [col("what", left=True), col("median s", ".4f"), col("/ transformers' two rows",
               ".2f", "x")]  # fmt: skip
    tables = [table(columns, [(NAMES[k], rows[k], rows[k] / base) for k in NAMES if k in rows],
                    title=title)]  # fmt: skip
    tables += [floor_table(floor), multi_table(results["multi"], results["llama"])]
    return tuple(notes), tables


def best_llama(times: dict[str, float]) -> float:
    return min(times["llama_rows"], times["llama_shared"])


def agreement(logprobs: dict[str, Any]) -> str:
    engine = logprobs["engine"]
    diff = lambda key: float(abs(engine - logprobs[key]).max())  # noqa: E731
    line = (
        f"labels' log-probs, largest difference from the engine's: transformers "
        f"{diff('hf'):.1e} (both dequantize the Q4_1 file to float32)"
    )
    if "llama" in logprobs:
        worst = max(diff("llama"), diff("llama_rows"))
        verdict = "within" if worst <= LOGPROB_TOLERANCE else "OUTSIDE"
        line += (
            f"; llama.cpp {diff('llama'):.3f} (KV cache kept) and {diff('llama_rows'):.3f} "
            f"(a row per item), {verdict} the stated tolerance of {LOGPROB_TOLERANCE} (llama.cpp "
            "multiplies the Q4_1 weights by 8-bit quantized activations)"
        )
    return line


def floor_note(floor: dict[str, Any]) -> str:
    bw, ms = floor["bandwidth"], floor["floor_s"] * 1e3
    return (
        f"the floor of a pass is {ms:.1f} ms (the weights' {floor['weight_bytes'] / 1e6:.0f} MB "
        f"over {bw / 1e9:.1f} GB/s, a float32 sum over 1 GiB); the small step runs at "
        f"{floor['step_s'] / floor['floor_s']:.1f}x it, its executable at "
        f"{floor['run_s'] / floor['floor_s']:.1f}x"
    )


def floor_table(floor: dict[str, Any]) -> Table:
    bw, t = floor["bandwidth"], floor["tokens"]
    at_bw = lambda n: f"{n / 1e6:.0f} MB, {n / bw * 1e3:.1f} ms at {bw / 1e9:.1f} GB/s"  # noqa: E731
    rows = [
        ("the step (`score_batch`: pack, place, run, unpack)", floor["step_s"],
         at_bw(floor["weight_bytes"]) + " (every weight once)"),
        ("its executable alone, arguments placed", floor["run_s"], None),
        ("the host's own work (the difference)", floor["step_s"] - floor["run_s"], None),
        ("the step after 0.2 s idle (threads parked, caches cold)", floor["idle_step_s"], None),
        ("a jitted no-op (XLA's dispatch)", f"{floor['noop_s'] * 1e3:.3f}", None),
        ("the LM head's matmul alone, 2 rows", floor["head_s"], at_bw(floor["head_bytes"])),
        (f"every layer's matmuls alone, {t} rows, over the scanned stack",
         floor["layers_scan_s"], at_bw(floor["layer_bytes"])),
        ("the same over per-layer arrays (no slice of the stack)", floor["layers_split_s"], None),
    ]  # fmt: skip
    rows = [(what, s if isinstance(s, str) else s * 1e3, note) for what, s, note in rows]
    title = f"Where the small request's step goes (one fused step of {t} tokens):"
    columns = [col("part", left=True), col("median ms", ".1f"), col("bytes read, floor", left=True)]
    return table(columns, rows, title=title, missing="")


def multi_table(multi: list[dict[str, Any]], llama: bool) -> Table:
    if not llama:
        title = "A 300-token query with 10-token items, the engine (llama.cpp not installed):"
        columns = [col("items", "d"), col("scorejax engine s", ".3f")]
        return table(columns, [(r["items"], r["engine_s"]) for r in multi], title=title)
    title = (
        "A 300-token query with 10-token items: the engine (shared prefix, shipped settings) "
        "against llama.cpp evaluating the query once and each item behind it (its KV cache "
        "kept across items):"
    )
    columns = [col("items", "d"), col("scorejax engine s", ".3f"), col("llama.cpp s", ".3f"),
               col("llama.cpp / scorejax", ".2f", "x"), col("max abs diff", ".3f")]  # fmt: skip
    rows = [(r["items"], r["engine_s"], r["llama_s"], r["llama_s"] / r["engine_s"], r["max_diff"])
            for r in multi]  # fmt: skip
    return table(columns, rows, title=title)


def step_tables(costs: dict[str, Any]) -> list[Table]:
    fit = f"`{costs['fixed_s']:.3f} s + {costs['per_token_s'] * 1e3:.2f} ms x tokens`"
    steps = table(
        [col("step", left=True), col("tokens", "d"), col("median s", ".3f")],
        [(r["step"], r["tokens"], r["seconds"]) for r in costs["rows"]],
        title=f"Step cost against tokens (fused steps fit {fit}):",
    )
    widths = table(
        [col("works per row", "d"), col("steps", "d"), col("median s for the 12", ".3f")],
        [(r["per_row"], r["steps"], r["seconds"]) for r in costs["row_widths"]],
        title="12 works of an 80-token query and two 5-token items (a burst of 60-word "
        "queries), fused rows of different widths:",
    )
    return [steps, widths]


PHASES = {
    "start": "validate, route, plan the step (`score_batch` up to the fused layout's `_run`)",
    "pack": "pack the row: tokens, positions, segments, score rows, labels (numpy)",
    "place": "place the 7 arguments on the device (`make_array_from_callback`)",
    "call": "call the executable (returns before it has run)",
    "wait": "wait for the executable",
    "copy": "copy its result to the host (`np.asarray`)",
    "unpack": "unpack into `[items, labels]`, return",
}


def breakdown_tables(figures: dict[str, Any], args: Any) -> tuple[tuple[str, ...], list[Table]]:
    """The notes and tables of ``loadtest.bench_small_breakdown``."""
    phases, kinds, parts = figures["phases"], figures["by_kind"], figures["pieces"]
    counts = figures["counts"]
    ms = lambda s: s * 1e3  # noqa: E731
    marked = sum(phases[k] for k in PHASES)
    host = marked - phases["call"] - phases["wait"]
    rows = [(PHASES[k], ms(phases[k]), phases[k] / marked) for k in PHASES]
    rows += [("the step, marked (the phases' sum)", ms(marked), 1.0),
             ("the same call unmarked", ms(phases["unmarked"]), None),
             ("its executable alone, placed", ms(phases["executable"]), None)]  # fmt: skip
    share = [col("median ms", ".2f"), col("share", ".0%")]
    host_table = table([col("phase of `score_batch` (each round: marked, unmarked, executable)",
                            left=True), *share], rows,
                       title=f"The host's part, {figures['dims']}:", missing="")  # fmt: skip
    traced = sum(kinds.values())
    scale = parts["executable"] / traced
    order = sorted(kinds, key=lambda k: -kinds[k])
    rows = [(k, counts[k] or None, ms(kinds[k]), kinds[k] / traced, ms(kinds[k] * scale))
            for k in order]  # fmt: skip
    rows += [("all ops, traced", sum(counts.values()), ms(traced), 1.0, ms(parts["executable"]))]
    kind_table = table(
        [col("op kind", left=True), col("ops run", "d"), col("traced ms", ".2f"),
         col("share", ".0%"), col("ms scaled to the untraced executable", ".1f")],
        rows, missing="",
        title="The executable's ops by kind (a `jax.profiler` trace: each op's exclusive time "
        "per step; scaled: its share of the executable's untraced median):",
    )  # fmt: skip
    layer = (parts["stack"] - parts["stack_1"]) / 29
    rest = parts["executable"] - parts["stack"] - parts["head"]
    rows = [
        ("the step's executable", ms(parts["executable"])),
        ("the decoder stack alone (embedding, 30 layers, final norm)", ms(parts["stack"])),
        ("the same with 1 layer", ms(parts["stack_1"])),
        ("one layer (the difference over 29)", ms(layer)),
        ("the LM head as the step runs it (one chunk of its 16 score rows)", ms(parts["head"])),
        ("the LM head over the 2 real rows only", ms(parts["head_real"])),
        ("the executable less the stack and the head", ms(rest)),
    ]
    piece_table = table([col("piece, jitted alone", left=True), col("median ms", ".2f")], rows,
                        title="Pieces jitted alone, timed in turn:")  # fmt: skip
    top = [(name, kind, runs, ms(s)) for name, kind, s, runs in figures["ops"][:12]]
    op_table = table([col("op (optimized HLO)", left=True), col("kind", left=True),
                      col("runs", "d"), col("traced ms per step", ".2f")], top,
                     title="The largest ops:")  # fmt: skip
    notes = (
        f"shipped serve_config.yaml settings (SmolLM2-135M-Instruct, float32); the `small` "
        f'request (9-token query, items `""` and `" not"`, 3 labels) as {figures["dims"]}; '
        f"medians of {args.repeats} rounds, the trace over {args.profiled} calls",
        f"the host's own work: {ms(host):.2f} ms of the {ms(marked):.1f} ms step "
        f"({host / marked:.1%}); the executable {ms(phases['call'] + phases['wait']):.1f} ms",
        f"{sum(counts.values()):.0f} ops (thunks) run per step; the trace adds to each, so the "
        f"traced ops sum to {ms(traced):.1f} ms against {ms(parts['executable']):.1f} ms "
        "untraced",
    )
    return notes, [host_table, kind_table, piece_table, op_table]
