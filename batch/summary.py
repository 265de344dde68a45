"""The job's one summary: rows, items, errors by reason, items/s, tokens computed / useful,
prefix tokens reused, wall time.

The stages add their counts to a ``Tally`` actor (one per job, its handle passed to them);
a retried batch counts again, so the token counters are the work done, retries included.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


class Tally:
    """Sums of named counts (a Ray actor: ``ray.remote(Tally)``)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, counts: dict[str, int]) -> None:
        self._counts.update(counts)

    def totals(self) -> dict[str, int]:
        return dict(self._counts)


@dataclass(frozen=True)
class Summary:
    rows: int
    items: int
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    computed_tokens: int = 0
    useful_tokens: int = 0
    reused_prefix_tokens: int = 0
    query_cache_hits: int = 0
    steps: int = 0
    engine_ms: int = 0  # the engines' step time, summed over engine actors
    retried_503: int = 0  # --engine serve: calls refused with a 503 and sent again
    # Grouping (batch.grouping): rows and bytes the shuffle moved, its operators' time (Ray
    # Data's stats, summed over their tasks), and what the object store spilled.
    shuffle_rows: int = 0
    shuffle_bytes: int = 0
    shuffle_ms: int = 0
    spilled_bytes: int = 0

    @classmethod
    def from_totals(cls, totals: dict[str, int], wall_s: float) -> Summary:
        errors = {
            k.split(":", 1)[1]: v for k, v in sorted(totals.items()) if k.startswith("error:")
        }
        names = (
            "rows",
            "items",
            "computed_tokens",
            "useful_tokens",
            "reused_prefix_tokens",
            "query_cache_hits",
            "steps",
            "engine_ms",
            "retried_503",
            "shuffle_rows",
            "shuffle_bytes",
            "shuffle_ms",
            "spilled_bytes",
        )
        return cls(
            errors=errors, wall_s=wall_s, **{name: int(totals.get(name, 0)) for name in names}
        )

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "items": self.items,
            "errors": self.errors,
            "items_per_s": round(self.items_per_s, 2),
            "computed_tokens": self.computed_tokens,
            "useful_tokens": self.useful_tokens,
            "padding": round(self.computed_tokens / self.useful_tokens, 3)
            if self.useful_tokens
            else None,
            "reused_prefix_tokens": self.reused_prefix_tokens,
            "query_cache_hits": self.query_cache_hits,
            "engine_steps": self.steps,
            "engine_s": round(self.engine_ms / 1000, 2),
            "retried_503": self.retried_503,
            "shuffle": {
                "rows": self.shuffle_rows,
                "bytes": self.shuffle_bytes,
                "s": round(self.shuffle_ms / 1000, 2),
                "spilled_bytes": self.spilled_bytes,
            },
            "wall_s": round(self.wall_s, 2),
        }

    def _shuffle(self) -> str:
        if not self.shuffle_rows:
            return "not grouped; "
        return (
            f"grouped: shuffle {self.shuffle_rows} rows, {self.shuffle_bytes / 2**20:.1f} MiB, "
            f"{self.shuffle_ms / 1000:.1f} s, spilled {self.spilled_bytes / 2**20:.1f} MiB; "
        )

    def line(self) -> str:
        errors = ", ".join(f"{k} {v}" for k, v in self.errors.items()) or "none"
        return (
            f"rows {self.rows}, items {self.items}, errors: {errors}; "
            f"{self.items_per_s:.1f} items/s; tokens computed {self.computed_tokens} / useful "
            f"{self.useful_tokens}; prefix tokens reused {self.reused_prefix_tokens}, query cache "
            f"hits {self.query_cache_hits}; "
            f"{self.steps} engine steps, {self.engine_ms / 1000:.1f} engine s; "
            f"{self._shuffle()}"
            f"wall {self.wall_s:.1f} s"
        )
