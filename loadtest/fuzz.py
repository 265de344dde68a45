"""Malformed and hostile /v1/score bodies: every one must get a 4xx, never a 5xx.

The fuzz runner (``make fuzz``): N generated bodies from every generator of
``loadtest.fuzz_run`` against the in-process ingress (the real validation and tokenizer of
``--config``'s model, replicas replaced by a checking backend) or, with ``--url``, a running
server; prints a table of answers by status and exits non-zero on any 5xx or any answer that
disagrees with the published OpenAPI document.

    python -m loadtest run fuzz --count 10000 [--seed 0] [--config serve_config.yaml] [--url URL]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from loadtest.fuzz_run import Target, in_process, over_http, run_all, table
from loadtest.harness import Workload, loopback_url

if TYPE_CHECKING:
    from app.service import ScoringService

SERVE_CONFIG = Path(__file__).resolve().parent.parent / "serve_config.yaml"


def _service(config: Path) -> ScoringService:
    """The ingress's service for the first application of ``config`` (its model's tokenizer)."""
    import yaml

    from app.service import ScoringService
    from replicas.settings import ReplicaSettings

    (app, *_) = yaml.safe_load(config.read_text())["applications"]
    return ScoringService.from_settings(ReplicaSettings.from_mapping(app["args"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fuzz POST /v1/score, /v1/completions, /tokenize and /detokenize."
    )
    parser.add_argument("--count", type=int, default=600, help="bodies in all (default 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=SERVE_CONFIG, help="in-process model")
    parser.add_argument("--url", help="a running server (loopback) instead of in-process")
    args = parser.parse_args(argv)
    try:
        args.url = args.url and loopback_url(args.url)
    except ValueError as error:
        parser.error(f"--url: {error}")
    start = time.perf_counter()

    def report(target: Target) -> tuple[int, int]:
        before = target.replica_requests()
        tallies = run_all(target, args.count, args.seed)
        after = target.replica_requests()
        print(table(tallies))
        reasons = sum((tally.reasons for tally in tallies), Counter())
        print("error reasons:", ", ".join(f"{name} {n}" for name, n in reasons.most_common()))
        for tally in tallies:
            for sample in tally.samples:
                print(f"  {tally.generator}: {sample}")
        if before is not None and after is not None:
            state = "restarted" if after < before else "no restart seen"  # a new one counts from 0
            print(f"replica requests (GET /v1/stats) {before} -> {after}: {state}")
        print(f"healthy after: {target.healthy()}; {time.perf_counter() - start:.0f} s")
        errors = sum(t.server_errors for t in tallies)
        return errors, sum(t.disagreements for t in tallies)

    if args.url:
        with over_http(args.url.rstrip("/")) as target:
            errors, disagreements = report(target)
    else:
        print(f"loading the tokenizer of {args.config.name}'s model ...", flush=True)
        with in_process(_service(args.config)) as (target, backend):
            errors, disagreements = report(target)
            print(f"reached the (checking) replica: {backend.calls} requests")
    return 0 if errors == 0 and disagreements == 0 else 1


# A tool with its own flags (tests call ``main``): the runner hands it the command line.
WORKLOAD = Workload(main=main)
