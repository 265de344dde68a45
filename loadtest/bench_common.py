"""Pieces shared by the benchmarks: the matmul peak, the transformers baseline, docs writing.

Imports nothing heavy at module level (jax, torch and transformers load inside the functions
that need them), so the pure helpers here unit-test quickly.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replicas.contract import ScoreWork

MODEL = "SmolLM2-135M-Instruct"
LABELS = (7042, 4528, 11452)  # " Paris", " London", " Berlin"


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls after one untimed warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def timed_together(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall seconds of each call over ``repeats`` rounds that run every call once in
    turn (after one untimed warm-up round): a machine whose speed drifts during the run
    slows every call alike, so their ratios hold where one call's samples taken after
    another's would not."""
    for fn in calls.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def matmul_peak_flops(sizes: tuple[int, ...] = (512, 1024, 1536, 2048), repeats: int = 8) -> float:
    """Best observed float32 matmul FLOP/s of this machine through XLA, over a few sizes."""
    import jax
    import jax.numpy as jnp

    matmul = jax.jit(lambda x, y: x @ y)
    best = 0.0
    for size in sizes:
        a = jnp.ones((size, size), jnp.float32)
        matmul(a, a).block_until_ready()
        for _ in range(repeats):
            start = time.perf_counter()
            matmul(a, a).block_until_ready()
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def load_hf_model(name: str = MODEL) -> Any:
    """transformers fp32 causal LM of ``name``'s local weights; torch uses every core."""
    import torch
    from transformers import AutoModelForCausalLM

    from replicas.checkpoints.sources import resolve_model_source

    torch.set_num_threads(os.cpu_count() or 1)
    source = resolve_model_source(name)
    return AutoModelForCausalLM.from_pretrained(
        str(source.directory), dtype=torch.float32, **source.transformers_kwargs()
    ).eval()


def hf_scorer(work: ScoreWork, model: Any | None = None) -> Callable[[], np.ndarray]:
    """transformers fp32 batched single-item scoring of the same GGUF weights.

    Rows are ``query + item``; returns a function computing ``[items, labels]`` log-probs.
    ``model``: a model from :func:`load_hf_model` (loaded here when omitted).
    """
    import torch

    if model is None:
        model = load_hf_model()
    rows = torch.tensor([work.query_ids + item for item in work.item_ids])
    labels = torch.tensor(work.label_ids)

    def score() -> np.ndarray:
        with torch.inference_mode():
            logits = model(rows, logits_to_keep=1).logits[:, -1]
            return torch.log_softmax(logits, -1)[:, labels].numpy()

    return score


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


def _is_section_end(line: str) -> bool:
    return line.startswith("## ") or line.startswith("<!-- ")


def _after_first_paragraph(lines: list[str]) -> int:
    """Index just after the first block of non-blank, non-heading lines (end if none)."""
    index = 0
    while index < len(lines) and (not lines[index].strip() or lines[index].startswith("#")):
        index += 1
    if index == len(lines):
        return len(lines)
    while index < len(lines) and lines[index].strip():
        index += 1
    return index


def replace_section(text: str, heading: str, body: str) -> str:
    """``text`` with the ``heading`` section's content replaced by ``body``.

    A section runs from its heading line to the next line starting with ``## `` or ``<!-- ``.
    A missing section is inserted right after the first paragraph block. Every other line of
    ``text`` is kept as it was.
    """
    lines = text.splitlines()
    section = [heading, "", *body.strip("\n").splitlines(), ""]
    if heading in lines:
        start = lines.index(heading)
        end = start + 1
        while end < len(lines) and not _is_section_end(lines[end]):
            end += 1
        lines[start:end] = section
    else:
        at = _after_first_paragraph(lines)
        lines[at:at] = ["", *section] if at and lines[at - 1].strip() else section
        if at + len(section) < len(lines) and lines[at + len(section)].strip() == "":
            del lines[at + len(section)]  # keep a single blank line before what follows
    return "\n".join(lines).rstrip("\n") + "\n"


def write_section(path: Path, heading: str, body: str, title: str = "# Benchmarks") -> None:
    """Replace or insert the ``heading`` section of the markdown file at ``path``."""
    text = path.read_text() if path.exists() else f"{title}\n"
    path.write_text(replace_section(text, heading, body))
