"""``python -m loadtest list | run NAME [options] | render``: every benchmark on one runner.

- ``list``: every benchmark and tool with what it measures;
- ``run NAME [--url URL] [options]``: measure (``run NAME --help``: its options); a
  benchmark stores its results as docs/results/<key>.json;
- ``render``: rewrite the docs' result sections from the stored results.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from loadtest.harness import run_workload
from loadtest.render import render
from loadtest.workloads import REGISTRY, workload


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "help"
    if command == "list":
        width = max(map(len, REGISTRY))
        for name, (_, summary) in REGISTRY.items():
            print(f"{name:<{width}}  {summary}")
        return 0
    if command == "run" and args and args[0] in REGISTRY:
        return run_workload(workload(args[0]), args[1:])
    if command == "render":
        for path in render():
            print(f"wrote {path}")
        return 0
    print(__doc__, file=sys.stderr)
    return 0 if command in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    raise SystemExit(main())
