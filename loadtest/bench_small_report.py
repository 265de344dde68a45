"""The markdown loadtest.bench_small writes: its tables and the floor they give."""

from __future__ import annotations

import os
from typing import Any

from loadtest.bench_common import machine_description
from loadtest.bench_llamacpp import LOGPROB_TOLERANCE, NOT_INSTALLED


def load_note() -> str:
    """This machine's 1-minute load average (other processes share the cores it measures)."""
    one, *_ = os.getloadavg()
    return f"1-minute load average {one:.1f}"


def report(results: dict[str, Any], args: Any) -> str:
    command = "python -m loadtest.bench_small" + (" --url URL" if results["served_s"] else "")
    lines = [
        f"`{command}` on {machine_description()}, {results['load_note']} when it started and "
        f"{load_note()} at the end (shipped serve_config.yaml settings, float32; medians of "
        f"{args.repeats}, {args.multi_repeats} for the multi-item rows).",
    ]
    lines += small_lines(results["small"], results["served_s"])
    if not results["llama"]:
        lines += ["", NOT_INSTALLED + "."]
    lines += floor_lines(results["floor"])
    lines += multi_lines(results["multi"], results["llama"])
    if results["costs"]:
        lines += step_lines(results["costs"])
    return "\n".join(lines) + "\n"


def small_lines(small: dict[str, Any], served: float | None) -> list[str]:
    times, base = small["times"], small["times"]["hf_rows"]
    names = {
        "engine": "scorejax engine, one fused step (in process)",
        "served": "scorejax `/v1/score` over HTTP (`make serve`)",
        "hf_rows": "transformers, a forward per row (two passes)",
        "hf_batched": "transformers, both rows in one padded forward",
        "llama_rows": "llama.cpp (Q4_1), a row per item from an empty KV cache",
        "llama_shared": "llama.cpp (Q4_1), the query once, then each item (KV cache kept)",
    }
    rows = dict(times, **({"served": served} if served else {}))
    lines = [
        "",
        f'A {small["query_tokens"]}-token query with 2 items (`""`, `" not"`), 3 labels, the '
        "same token ids in every row:",
        "",
        "| what | median s | / transformers' two rows |",
        "|---|---:|---:|",
        *(
            f"| {names[key]} | {rows[key]:.4f} | {rows[key] / base:.2f}x |"
            for key in names
            if key in rows
        ),
        "",
    ]
    lines.append(
        f"Engine / transformers' two rows: **{times['engine'] / base:.2f}x** (target <= 0.6x)"
        + (f"; served: **{served / base:.2f}x**" if served else "")
        + (
            f"; engine / llama.cpp's best: {times['engine'] / best_llama(times):.2f}x."
            if "llama_rows" in times
            else "."
        )
    )
    lines += agreement_lines(small["logprobs"])
    return lines


def best_llama(times: dict[str, float]) -> float:
    return min(times["llama_rows"], times["llama_shared"])


def agreement_lines(logprobs: dict[str, Any]) -> list[str]:
    engine = logprobs["engine"]
    diff = lambda key: float(abs(engine - logprobs[key]).max())  # noqa: E731
    line = (
        f"Labels' log-probs, largest |difference| from the engine's: transformers "
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
    return ["", line + "."]


def floor_lines(floor: dict[str, Any]) -> list[str]:
    bw = floor["bandwidth"]
    at_bw = lambda n: f"{n / 1e6:.0f} MB, {n / bw * 1e3:.1f} ms at {bw / 1e9:.1f} GB/s"  # noqa: E731
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    t = floor["tokens"]
    host = floor["step_s"] - floor["run_s"]
    return [
        "",
        f"Where the small request's step goes (one fused step of {t} tokens):",
        "",
        "| part | median ms | bytes read, floor |",
        "|---|---:|---|",
        f"| the step (`score_batch`: pack, place, run, unpack) | {ms(floor['step_s'])} | "
        f"{at_bw(floor['weight_bytes'])} (every weight once) |",
        f"| its executable alone, arguments placed | {ms(floor['run_s'])} | |",
        f"| the host's own work (the difference) | {ms(host)} | |",
        f"| the step after 0.2 s idle (threads parked, caches cold) | "
        f"{ms(floor['idle_step_s'])} | |",
        f"| a jitted no-op (XLA's dispatch) | {floor['noop_s'] * 1e3:.3f} | |",
        f"| the LM head's matmul alone, 2 rows | {ms(floor['head_s'])} | "
        f"{at_bw(floor['head_bytes'])} |",
        f"| every layer's matmuls alone, {t} rows, over the scanned stack | "
        f"{ms(floor['layers_scan_s'])} | {at_bw(floor['layer_bytes'])} |",
        f"| the same over per-layer arrays (no slice of the stack) | "
        f"{ms(floor['layers_split_s'])} | |",
        "",
        f"The floor of a pass is {ms(floor['floor_s'])} ms (the weights' "
        f"{floor['weight_bytes'] / 1e6:.0f} MB over {bw / 1e9:.1f} GB/s, a float32 sum over "
        f"1 GiB); the small step runs at **{floor['step_s'] / floor['floor_s']:.1f}x** it, "
        f"its executable at {floor['run_s'] / floor['floor_s']:.1f}x.",
    ]


def multi_lines(multi: list[dict[str, Any]], llama: bool) -> list[str]:
    if not llama:
        return [
            "",
            "A 300-token query with 10-token items, the engine (llama.cpp not installed):",
            "",
            "| items | scorejax engine s |",
            "|---:|---:|",
            *(f"| {r['items']} | {r['engine_s']:.3f} |" for r in multi),
        ]
    return [
        "",
        "A 300-token query with 10-token items: the engine (shared prefix, shipped settings) "
        "against llama.cpp evaluating the query once and each item behind it (its KV cache "
        "kept across items):",
        "",
        "| items | scorejax engine s | llama.cpp s | llama.cpp / scorejax | max abs diff |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {r['items']} | {r['engine_s']:.3f} | {r['llama_s']:.3f} | "
            f"{r['llama_s'] / r['engine_s']:.2f}x | {r['max_diff']:.3f} |"
            for r in multi
        ),
    ]


def step_lines(costs: dict[str, Any]) -> list[str]:
    return [
        "",
        "Step cost against tokens:",
        "",
        "| step | tokens | median s |",
        "|---|---:|---:|",
        *(f"| {r['step']} | {r['tokens']} | {r['seconds']:.3f} |" for r in costs["rows"]),
        "",
        f"Fused steps fit `{costs['fixed_s']:.3f} s + {costs['per_token_s'] * 1e3:.2f} ms x "
        "tokens`.",
        "",
        "12 works of an 80-token query and two 5-token items (a burst of 60-word queries), "
        "fused rows of different widths:",
        "",
        "| works per row | steps | median s for the 12 |",
        "|---:|---:|---:|",
        *(f"| {r['per_row']} | {r['steps']} | {r['seconds']:.3f} |" for r in costs["row_widths"]),
    ]
