"""Long compile-only subprocesses started when the suite's collection ends, niced, so they
use the cores the tests leave idle (XLA compiles and Ray Serve waits leave one or both idle
much of the time) instead of running alone when their test module's turn comes.

A test module that wants some defines ``background_commands(folder) -> {key: Command}``;
``conftest.py`` starts them for the collected modules only, its ``background`` fixture hands
them out, and every one still running when the run ends is killed. Each command leaves its
output, exit status and process group in files of the run's folder, where its test waits
for them; ``start_once`` launches them once per run folder (a second caller with the same
folder, as pytest-xdist workers sharing one would be, waits for the first one's manifest).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.xla_flags import production_env

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.5
MANIFEST_WAIT_S = 300  # the launching caller makes the commands' inputs first


@dataclass(frozen=True)
class Command:
    """A subprocess to run from the repository root; ``out``: the file it writes;
    ``niceness``: the tests in the foreground come first, and a command needed earlier in
    the run gets a lower one than those needed later."""

    args: tuple[str, ...]
    out: Path
    niceness: int = 10


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    out: Path


class Started:
    """One background command, running or done, seen through the files it leaves in
    ``folder``: ``log`` (stdout and stderr), ``rc`` (its exit status, written last)."""

    def __init__(self, folder: Path, out: Path) -> None:
        self.folder, self.out = folder, out

    def launch(self, command: Command) -> None:
        # Compiled as a user's run compiles (the planner's figures are compared with the
        # manifests' to 1%; tpu_check reports compile times).
        script = 'nice -n "$0" "$@" >"$LOG" 2>&1; echo $? >"$RC.tmp" && mv "$RC.tmp" "$RC"'
        env = production_env(os.environ) | {
            "LOG": str(self.folder / "log"),
            "RC": str(self.folder / "rc"),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            ["sh", "-c", script, str(command.niceness), *command.args],
            cwd=ROOT,
            env=env,
            # Its own process group (killed whole at the end), in pytest's session: a new
            # session would be its own scheduler autogroup, where niceness no longer yields
            # the cores to the tests (each compile took a core's half beside them).
            process_group=0,
        )
        (self.folder / "pgid").write_text(str(process.pid))

    def result(self, timeout_s: float) -> Finished:
        """Wait for it (at most ``timeout_s`` more seconds)."""
        rc, deadline = self.folder / "rc", time.monotonic() + timeout_s
        while not rc.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"background command in {self.folder}: not done in {timeout_s} s"
                )
            time.sleep(POLL_S)
        return Finished(int(rc.read_text()), (self.folder / "log").read_text(), self.out)


def start_once(
    make_commands: Callable[[], dict[str, Command]], run_folder: Path
) -> dict[str, Started]:
    """Handles of the run's background commands: the first caller of the run makes and
    launches them and writes where each one's files go; a later caller reads that."""
    folder, manifest = run_folder / "background", run_folder / "background.json"
    try:
        folder.mkdir(parents=True)
    except FileExistsError:  # another worker of this run launched them
        deadline = time.monotonic() + MANIFEST_WAIT_S
        while not manifest.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        places = json.loads(manifest.read_text())
        return {key: Started(Path(a), Path(b)) for key, (a, b) in places.items()}
    started = {}
    for n, (key, command) in enumerate(sorted(make_commands().items())):
        started[key] = Started(folder / f"{n:02d}", command.out)
        started[key].launch(command)
    places = {key: [str(s.folder), str(s.out)] for key, s in started.items()}
    manifest.with_suffix(".tmp").write_text(json.dumps(places))
    manifest.with_suffix(".tmp").replace(manifest)
    return started


def kill_all(run_folder: Path) -> None:
    """Kill every background command of the run still running (its whole process group)."""
    for pgid in sorted((run_folder / "background").glob("*/pgid")):
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(pgid.read_text()), signal.SIGKILL)
