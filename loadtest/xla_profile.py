"""Per-op times of a compiled XLA executable on CPU, by op kind (loadtest.bench_small_breakdown).

A ``jax.profiler`` trace records one event per thunk (an optimized HLO instruction: a fusion,
a dot, a copy, a while loop), nested inside the loops and executors that run it; each
instruction's exclusive time (its event less the events inside it) is summed per call. Its
kind comes from the optimized HLO text: the opcodes it runs (a fusion's, recursively) and the
Python functions its ops were traced from (``stack_frame_id`` through the ``StackFrames``
table). A ``ThunkExecutor``'s own exclusive time is XLA's dispatch between ops.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS = (
    "projection matmuls", "attention (scores, mask, softmax, values)", "norms",
    "LM head (vocabulary logits, log-softmax)", "gathers (embedding, score rows, labels)",
    "converts", "elementwise (RoPE, residuals, SiLU gate)",
    "copies and slices (the scanned layer stack)", "loop control (while, conditions)",
    "between ops (XLA's thunk executor)",
)  # fmt: skip
EXECUTOR = KINDS[-1]
CONTROL = {"while", "conditional", "call"}
MOVES = {"fusion", "copy", "dynamic-slice", "dynamic-update-slice", "slice", "concatenate", "pad",
         "transpose", "reshape", "bitcast", "broadcast", "tuple", "get-tuple-element",
         "parameter", "constant", "iota"}  # fmt: skip
# Python functions (qualified names) whose ops are of one kind, in the traced stack of an op.
ATTENTION = {"attend_dense", "_masked_softmax", "masked_attention", "segment_mask",
             "work_segment_mask", "CausalSpec.dense_mask"}  # fmt: skip
HEAD = {"CausalLM.logits", "CausalLM.label_logprobs"}
NORMS = {"RMSNorm.__call__", "CausalLM._final_norm"}
_LINE = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=\{?%?([\w.\-]+)")
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_TABLE = re.compile(r"^(\d+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")


def parse_hlo(text: str) -> tuple[dict[str, tuple[str, str]], dict[str, list[str]]]:
    """Optimized HLO text -> each instruction's (opcode, line), each computation's
    instruction names."""
    instructions: dict[str, tuple[str, str]] = {}
    computations: dict[str, list[str]] = defaultdict(list)
    current = ""
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            current = line.removeprefix("ENTRY ").lstrip("%").split()[0]
            continue
        match = _LINE.match(line)
        if match:
            opcode = _OPCODE.search(" " + match.group(2))
            instructions[match.group(1)] = (opcode.group(1) if opcode else "?", line)
            computations[current].append(match.group(1))
    return instructions, computations


def frame_functions(text: str) -> dict[int, frozenset[str]]:
    """Each stack frame of an optimized HLO text (its ``StackFrames`` table) -> the
    qualified names of the Python functions in it and every frame it sits in."""
    tables: dict[str, dict[int, str]] = defaultdict(dict)
    section = ""
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
        elif section and (row := _TABLE.match(line)):
            tables[section][int(row.group(1))] = row.group(2)
        elif line.startswith("%") or line.startswith("ENTRY"):
            break
    fields = lambda row: {k: int(v) for k, v in _FIELD.findall(row)}  # noqa: E731
    location = {i: fields(row) for i, row in tables["FileLocations"].items()}
    frames = {i: fields(row) for i, row in tables["StackFrames"].items()}
    names = {i: row.strip('"') for i, row in tables["FunctionNames"].items()}
    out: dict[int, frozenset[str]] = {}
    for frame in frames:
        seen, here = set(), frame
        while here in frames and here not in seen:  # up to the outermost frame
            seen.add(here)
            function = location.get(frames[here].get("file_location_id", 0), {})
            name = names.get(function.get("function_name_id", 0))
            out[frame] = out.get(frame, frozenset()) | ({name} - {None})
            here = frames[here].get("parent_frame_id", 0)
    return out


class Classifier:
    """The kind (``KINDS``) of each instruction of one optimized HLO module."""

    def __init__(self, hlo_text: str, vocab: int) -> None:
        self.instructions, self.computations = parse_hlo(hlo_text)
        self._frames = frame_functions(hlo_text)
        self._vocab = re.compile(rf"[\[,]{vocab}[\],]")

    def _fused(self, name: str) -> list[tuple[str, str]]:
        """(opcode, line) of ``name`` and, for a fusion, of its fused computations."""
        opcode, line = self.instructions[name]
        out = [(opcode, line)]
        if opcode not in CONTROL:
            for called in _CALLS.findall(line):
                for inner in self.computations.get(called, ()):
                    out += self._fused(inner)
        return out

    def _functions(self, line: str) -> frozenset[str]:
        frame = _FRAME.search(line)
        return self._frames.get(int(frame.group(1)), frozenset()) if frame else frozenset()

    @functools.cache  # noqa: B019 (one classifier a module, kept for a run)
    def kind(self, name: str) -> str:
        if name not in self.instructions:
            return KINDS[6]
        fused = self._fused(name)
        ops = {op for op, _ in fused}
        funcs = set().union(*(self._functions(line) for _, line in fused))
        vocab = any(self._vocab.search(line) for _, line in fused)
        if fused[0][0] in CONTROL:
            return KINDS[8]
        if "gather" in ops:
            return KINDS[4]
        if ops & {"dot", "convolution"}:
            if vocab or funcs & HEAD:
                return KINDS[3]
            batched = any("lhs_batch_dims" in line for op, line in fused if op == "dot")
            return KINDS[1] if batched or funcs & ATTENTION else KINDS[0]
        if vocab or funcs & HEAD:
            return KINDS[3]
        if "rsqrt" in ops or funcs & NORMS:
            return KINDS[2]
        if funcs & ATTENTION:
            return KINDS[1]
        if ops <= MOVES:
            return KINDS[7]
        if ops - MOVES <= {"convert"}:
            return KINDS[5]
        return KINDS[6]


def exclusive_times(events: list[Any]) -> list[tuple[str, float]]:
    """(name, exclusive seconds) of one thread's events: each less the events inside it."""
    out: list[tuple[str, float]] = []
    stack: list[list[Any]] = []  # [name, end_ns, exclusive_ns]
    for event in sorted(events, key=lambda e: (e.start_ns, -e.duration_ns)):
        while stack and stack[-1][1] <= event.start_ns:
            name, _, own = stack.pop()
            out.append((name, own / 1e9))
        if stack:
            stack[-1][2] -= event.duration_ns
        stack.append([event.name, event.start_ns + event.duration_ns, event.duration_ns])
    out += [(name, own / 1e9) for name, _, own in stack]
    return out


def profile_by_kind(
    call: Callable[[], Any], classifier: Classifier, calls: int
) -> tuple[dict[str, float], dict[str, float], list[tuple[str, str, float, float]]]:
    """From a trace of ``calls`` calls, per call: seconds of each kind, ops run of each kind,
    and every op as (name, kind, seconds, times run), most seconds first."""
    import jax

    call()
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(calls):
                call()
        (path,) = Path(folder).rglob("*.xplane.pb")
        data = jax.profiler.ProfileData.from_file(str(path))
    seconds: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    for plane in data.planes:
        for line in plane.lines:
            ours = [e for e in line.events
                    if e.name == "ThunkExecutor::Execute" or "hlo_op" in dict(e.stats)]  # fmt: skip
            for name, own in exclusive_times(ours):
                seconds[name] += own / calls
                runs[name] += 1 / calls
    by_kind, counts = dict.fromkeys(KINDS, 0.0), dict.fromkeys(KINDS, 0.0)
    ops = []
    for name, own in seconds.most_common():
        kind = EXECUTOR if name == "ThunkExecutor::Execute" else classifier.kind(name)
        by_kind[kind] += own
        counts[kind] += runs[name] if kind != EXECUTOR else 0
        ops.append((name, kind, own, runs[name]))
    return by_kind, counts, ops
