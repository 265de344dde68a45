"""Long compile-only subprocesses started when the suite's collection ends, niced, so they
use the cores the tests leave idle (XLA compiles and Ray Serve waits leave one or both idle
much of the time) instead of running alone when their test module's turn comes.

A test module that wants some defines ``background_commands(folder) -> {key: Command}``;
``conftest.py`` starts them for the collected modules only, its ``background`` fixture hands
them out, and every one still running when the session ends is killed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.xla_flags import production_env

ROOT = Path(__file__).resolve().parents[1]


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
    """One running background command."""

    def __init__(self, command: Command) -> None:
        self.command = command
        # Compiled as a user's run compiles (the planner's figures are compared with the
        # manifests' to 1%; tpu_check reports compile times).
        env = production_env(os.environ)
        self._process = subprocess.Popen(
            ["nice", "-n", str(command.niceness), *command.args],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def result(self, timeout_s: float) -> Finished:
        """Wait for it (at most ``timeout_s`` more seconds)."""
        stdout, _ = self._process.communicate(timeout=timeout_s)
        return Finished(self._process.returncode, stdout, self.command.out)

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.communicate()


def start_all(commands: dict[str, Command]) -> dict[str, Started]:
    return {key: Started(command) for key, command in commands.items()}
