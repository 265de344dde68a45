"""What a compiled signature is worth, and the record that keeps it across restarts.

A traffic signature (one compiled after the configured warm-up) is worth what it saves: how
often it runs (``Usage``: a count of uses that halves every ``HALF_LIFE_S``) times the
compute its cheapest covering alternative would waste on it (``saving``: that signature's
cost for the work minus its own). A one-off shape's uses decay to nothing; a recurring one's
stay up. ``SignatureRecord`` is the JSON file beside the persistent compilation cache that
lists every kept signature with its uses, last use (wall-clock time) and saving, so a
restart compiles the most valuable ones again (a cache load) and they keep their history.

A record belongs to the model and settings that wrote it: its file is named by a fingerprint
of ``record_identity`` (the model's name or path, its config, its parameters' shapes and
dtypes, LoRA slots included, the mesh and the settings that change a step's program), so one
cache folder serves several models one after another and none replays another's steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HALF_LIFE_S = 600.0  # a use counts half as much ten minutes later
Key = tuple[str, Any]
RECORD_PREFIX = "scorejax-signatures-"  # then the fingerprint, then .json
# Settings that change what a signature compiles to (or which kinds exist) beyond the model.
COMPILE_SETTINGS = (
    "dtype", "quantization", "mesh_shape", "layout", "attention", "layer_loop", "max_loras",
    "max_lora_rank", "hosts_per_replica", "pooling", "normalize",
)  # fmt: skip


def record_identity(name: str, model: Any, params: Any, mesh: Any, settings: Any) -> dict:
    """What an engine's compiled steps depend on besides their signatures (JSON-able)."""
    import jax  # here, not at the top: the ingress reads the record's reasons jax-free

    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    return {
        "model": name,
        "config": repr(model.config),
        "lora_update": model.lora_update,
        "params": [[jax.tree_util.keystr(path), *shape_of(leaf)] for path, leaf in leaves],
        "mesh": {str(axis): int(size) for axis, size in mesh.shape.items()},
        "platform": mesh.devices.flat[0].platform,
        "settings": {field: repr(settings.value(field)) for field in COMPILE_SETTINGS},
    }


def shape_of(leaf: Any) -> tuple[list[int], str]:
    return list(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", ""))


def record_path(directory: str | Path | None, identity: Mapping[str, Any]) -> Path | None:
    """The record of the engine ``identity`` describes, in ``directory`` (None: none)."""
    if not directory:
        return None
    text = json.dumps(identity, sort_keys=True, default=repr)
    fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
    return Path(directory) / f"{RECORD_PREFIX}{fingerprint}.json"


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
        self.path = path
        self._dims_types = dict(dims_types)
        self._lock = threading.Lock()  # one writer at a time

    def read(self) -> list[Entry]:
        """The recorded signatures this engine knows how to build (stale entries, e.g. from
        an older version or another layout, are skipped), in the file's order."""
        if self.path is None or not self.path.exists():
            return []
        try:
            rows = json.loads(self.path.read_text())
        except (OSError, ValueError):
            logger.warning("ignoring unreadable compile record %s", self.path)
            return []
        entries = []
        for row in rows if isinstance(rows, list) else []:
            try:
                key = (row["kind"], self._dims_types[row["kind"]](*row["dims"]))
                usage = Usage(float(row.get("uses", 0.0)), float(row.get("last_used", 0.0)))
                saving = math.inf if row.get("saving") is None else float(row["saving"])
            except Exception:  # any row this version cannot read is stale: skip it
                continue
            entries.append(Entry(key, usage, saving))
        logger.info("compile record %s: %d signatures to replay", self.path, len(entries))
        return entries

    def write(self, entries: Iterable[Entry]) -> None:
        if self.path is None:
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
                self.path.parent.mkdir(parents=True, exist_ok=True)
                writer = f"{os.getpid()}-{threading.get_ident()}"  # engines may share a file
                tmp = self.path.with_name(f"{self.path.name}.{writer}.tmp")
                tmp.write_text(json.dumps(rows))
                tmp.replace(self.path)
            except OSError:
                logger.warning("cannot write compile record %s", self.path)
