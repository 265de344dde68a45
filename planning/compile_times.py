"""Where a layout's planning time goes: the wall seconds of each compile, by purpose.

A layout's row is made of compiles of three purposes: ``fit`` (the serving steps at every
layer, the most expensive warm-up signature of each kind, for their memory), ``bytes``
(the workload's serving steps, for the bytes they move and the scanned step's FLOPs and
collectives, when ``fit`` did not compile them already) and ``cost no layers`` (the same
steps with an empty layer stack: the served step less them is one layer). ``CompileTimes``
compiles one key at a time, prints a line per compile (stderr) and sums the seconds per
purpose for the row.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class CompileTimes:
    """Seconds spent compiling, one entry per compiled key (nested compiles included in
    the key that needed them)."""

    echo: TextIO | None = sys.stderr
    entries: list[dict[str, Any]] = field(default_factory=list)

    def compile(self, engine: Any, keys: Sequence[tuple[str, Any]], purpose: str) -> None:
        """Compile ``keys`` on ``engine`` one by one; keys it holds already cost nothing and
        are not recorded, a compile that raises is recorded before the error goes on."""
        for key in keys:
            before = set(engine.executables())
            if key in before:
                continue
            start, cpu = time.perf_counter(), time.process_time()
            try:
                engine.compile_keys([key])
            finally:  # a compile the compiler refused (out of HBM) took its time too
                seconds = time.perf_counter() - start
                cpu = time.process_time() - cpu
                nested = [k for k in engine.executables() if k not in before and k != key]
                self.record(purpose, key, (seconds, cpu), len(nested))

    def record(
        self, purpose: str, key: tuple[str, Any], spent: tuple[float, float], nested: int
    ) -> None:
        """``spent``: (wall seconds, this process's CPU seconds); on a shared machine the
        CPU seconds are the compile's own work, the wall seconds include waiting."""
        (kind, dims), (seconds, cpu) = key, spent
        entry = {"purpose": purpose, "kind": kind, "dims": list(dims.astuple())}
        entry |= {"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "nested": nested}
        self.entries.append(entry)
        if self.echo is not None:
            also = f" (+{nested} nested)" if nested else ""
            print(
                f"    compile {purpose:<14} {kind:<7} {tuple(entry['dims'])!s:<28} "
                f"{seconds:7.1f} s wall, {cpu:7.1f} s CPU{also}",
                file=self.echo,
                flush=True,
            )

    def totals(self, measure: str = "seconds") -> dict[str, float]:
        """Wall (or ``cpu_seconds``) per purpose, in the order they first ran."""
        sums: dict[str, float] = {}
        for entry in self.entries:
            sums[entry["purpose"]] = sums.get(entry["purpose"], 0.0) + entry[measure]
        return {purpose: round(seconds, 1) for purpose, seconds in sums.items()}
