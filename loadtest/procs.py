"""The Ray workers that serve a URL, found from outside by process title, and their RSS
(``loadtest.soak``'s memory samples; psutil, this machine's process table)."""

from __future__ import annotations

import psutil

ROLES = {"replica": "ScoringReplica", "ingress": "ScoreIngress", "proxy": "ProxyActor"}
MIB = 1024 * 1024


def serving_raylet(port: int) -> int | None:
    """The raylet whose Ray workers serve ``port``: the parent of the process listening on it
    (Serve's proxy). Other Ray clusters on this machine (a test suite's) have their own."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return None  # not ours to see
            return psutil.Process(conn.pid).ppid()
    return None


def find_workers(raylet: int | None) -> dict[str, list[psutil.Process]]:
    """Ray workers by role, matched on their process title (``ray::ServeReplica:app:Name``),
    among the children of ``raylet`` (every matching process when it is None)."""
    found: dict[str, list[psutil.Process]] = {role: [] for role in ROLES}
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        title = " ".join(proc.info["cmdline"] or ())
        if not title.startswith("ray::") or raylet not in (None, proc.info["ppid"]):
            continue
        for role, name in ROLES.items():
            if (f":{name}" in title and "ServeReplica" in title) or (
                role == "proxy" and title.startswith(f"ray::{name}")
            ):
                found[role].append(proc)
    return found


def rss_mib(procs: list[psutil.Process]) -> dict[str, float]:
    """RSS in MiB by pid (a str, as JSON keys are)."""
    found = {}
    for proc in procs:
        try:
            found[str(proc.pid)] = round(proc.memory_info().rss / MIB, 1)
        except psutil.Error:
            continue
    return dict(sorted(found.items()))
