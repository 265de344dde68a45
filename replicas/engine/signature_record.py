"""What a compiled signature is worth, and the record that keeps it across restarts.

A traffic signature (one compiled after the configured warm-up) is worth what it saves: how
often it runs (``Usage``: a count of uses that halves every ``HALF_LIFE_S``) times the
compute its cheapest covering alternative would waste on it (``saving``: that signature's
cost for the work minus its own). A one-off shape's uses decay to nothing; a recurring one's
stay up. ``SignatureRecord`` is the JSON file beside the persistent compilation cache that
lists every kept signature with its uses, last use (wall-clock time) and saving, so a
restart compiles the most valuable ones again (a cache load) and they keep their history.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HALF_LIFE_S = 600.0  # a use counts half as much ten minutes later
Key = tuple[str, Any]


@dataclass(frozen=True)
class Usage:
    """Decayed uses of a signature (or of a shape not compiled yet) and its last use."""

    uses: float = 0.0
    last: float = 0.0  # wall-clock seconds

    def at(self, now: float) -> float:
        """The uses as of ``now``: each halved for every ``HALF_LIFE_S`` since."""
        return self.uses * 0.5 ** (max(now - self.last, 0.0) / HALF_LIFE_S)

    def used(self, now: float) -> Usage:
        return Usage(self.at(now) + 1.0, now)


@dataclass(frozen=True)
class Entry:
    """One recorded signature: its key, usage and saving (``inf``: nothing else covers it)."""

    key: Key
    usage: Usage = Usage()
    saving: float = math.inf

    def value(self, now: float) -> float:
        uses = self.usage.at(now)
        return uses * self.saving if uses > 0 else 0.0


class SignatureRecord:
    """The record file: read, and rewritten whole (atomically) on every change."""

    def __init__(self, path: Path | None, dims_types: Mapping[str, type]) -> None:
        self._path = path
        self._dims_types = dict(dims_types)
        self._lock = threading.Lock()  # one writer at a time (the tmp file is shared)

    def read(self) -> list[Entry]:
        """The recorded signatures this engine knows how to build (stale entries, e.g. from
        an older version or another layout, are skipped), in the file's order."""
        if self._path is None or not self._path.exists():
            return []
        try:
            rows = json.loads(self._path.read_text())
        except (OSError, ValueError):
            logger.warning("ignoring unreadable compile record %s", self._path)
            return []
        entries = []
        for row in rows if isinstance(rows, list) else []:
            try:
                key = (row["kind"], self._dims_types[row["kind"]](*row["dims"]))
                usage = Usage(float(row.get("uses", 0.0)), float(row.get("last_used", 0.0)))
                saving = math.inf if row.get("saving") is None else float(row["saving"])
            except (KeyError, TypeError, ValueError):
                continue
            entries.append(Entry(key, usage, saving))
        return entries

    def write(self, entries: Iterable[Entry]) -> None:
        if self._path is None:
            return
        rows = [
            {
                "kind": kind,
                "dims": list(dims.astuple()),
                "uses": round(entry.usage.uses, 4),
                "last_used": round(entry.usage.last, 3),
                "saving": entry.saving if math.isfinite(entry.saving) else None,
            }
            for entry in entries
            for kind, dims in [entry.key]
        ]
        with self._lock:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self._path.with_suffix(".tmp")
                tmp.write_text(json.dumps(rows))
                tmp.replace(self._path)
            except OSError:
                logger.warning("cannot write compile record %s", self._path)
