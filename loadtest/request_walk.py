"""The walk of one /v1/score request through the tree, counted from the calls it makes.

    python -m loadtest run request_walk [--trees PATH,PATH]

Each tree (a checkout; default this one) runs in a child process on its own code: the shipped
serve_config.yaml with only ``model`` changed (``replicas.checkpoints.demo.tiny_model``) and a
small warm-up, the ingress's app in process over a real ``ScoringReplica`` and engine (Serve's
batching without a cluster), one warm request, then one cold-query request traced: every call
into ``app/``, ``replicas/`` or ``cluster/`` on any thread. A stop is a function it runs
(once, in first-run order); a return is a stop in a file the walk had already left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.harness import ROOT, Option, Result, Run, Workload, col, table

TRACED = ("app", "replicas", "cluster")
UNNAMED = {"<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<module>"}
WARM = {"query": "a warm query", "items": [" one", " two", " three"], "label_token_ids": [1, 2]}
COLD = {**WARM, "query": "a cold query here"}


def measure(o: argparse.Namespace, run: Run) -> list[Result]:
    trees = [Path(tree).resolve() for tree in o.trees.split(",")]
    rows, figures = [], {}
    for tree in trees:
        run.say(f"tracing one request on {tree}")
        calls = traced_calls(tree)
        stops = list(dict.fromkeys((path, name) for path, name, _ in calls))
        hops = list(dict.fromkeys((path, name) for path, name, hop in calls if hop))
        layers = Counter(layer_of(path) for path, _ in stops)
        files = len({path for path, _ in stops})
        rows.append((commit_of(tree), len(hops), returns(hops), len(stops), returns(stops),
                     files, len(calls), *(layers[name] for name in LAYERS)))  # fmt: skip
        figures[str(tree)] = {"hops": hops, "stops": stops, "calls": len(calls)}
    columns = [col("tree", left=True), col("file stops"), col("their returns"),
               col("function stops"), col("their returns"), col("files"), col("calls"),
               *(col(f"{name} functions") for name in LAYERS)]  # fmt: skip
    notes = ["the shipped serve_config.yaml with only model changed (a tiny random Llama), "
             "warm-up cut to one small tier; the cold request: a 5-token query, 3 items, 2 labels",
             "function stops: the functions of app/, replicas/ and cluster/ the request runs, "
             "each once; file stops: those of them it enters from another file (the walk's "
             "hops, as docs/architecture.md's walk names them); returns: stops in a file the "
             "walk had already left"]  # fmt: skip
    title = "The walk of one /v1/score request, from the calls it makes"
    result = run.result(title, [table(columns, rows)], key="request-walk", notes=notes,
                        figures=figures, doc="docs/architecture.md")  # fmt: skip
    return [result]


LAYERS = ("app", "replicas/serving", "replicas/engine", "replicas/model", "other")


def layer_of(path: str) -> str:
    return next((name for name in LAYERS[:-1] if path.startswith(name + "/")), "other")


def returns(stops: Sequence[tuple[str, ...]]) -> int:
    """How many times the walk enters a file it had already left."""
    left: set[str] = set()
    count, current = 0, None
    for path, *_ in stops:
        if path != current:
            count += path in left
            if current is not None:
                left.add(current)
            current = path
    return count


def commit_of(tree: Path) -> str:
    git = ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"]
    head = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", *TRACED],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return f"{head}{'+' if dirty else ''}"


def traced_calls(tree: Path) -> list[tuple[str, str, bool]]:
    """The calls of one cold request on ``tree``'s code, in a child process: (file,
    function, whether it was called from another file)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
    child = [sys.executable, str(Path(__file__).resolve()), "--child"]
    done = subprocess.run(child, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the traced request failed on {tree}:\n{done.stderr[-4000:]}")
    return [(path, name, hop) for path, name, hop in json.loads(done.stdout.splitlines()[-1])]


def child() -> None:
    """In the traced tree (cwd): one warm request, then the cold one traced; prints the calls
    as one JSON line."""
    import asyncio

    import httpx
    import yaml
    from ray.serve import batching

    from app.http import build_api
    from app.service import ScoringService
    from replicas.checkpoints.demo import tiny_model
    from replicas.serving.deployment import ScoringReplica
    from replicas.settings import ReplicaSettings

    # Serve's batch queue asks for its replica's context once; there is none in process.
    batching._BatchQueue._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda q: None
    root = Path.cwd()
    prefixes = tuple(f"{root / name}/" for name in TRACED)
    calls: list[tuple[str, str, bool]] = []
    recording = threading.Event()

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        traced = event == "call" and recording.is_set() and code.co_name not in UNNAMED
        if traced and code.co_filename.startswith(prefixes):
            caller = frame.f_back.f_code.co_filename if frame.f_back else ""
            path = code.co_filename[len(str(root)) + 1 :]
            calls.append((path, code.co_qualname, caller != code.co_filename))

    threading.setprofile(profile)  # the replica's and engine's threads, started below
    directory = Path(tempfile.mkdtemp()) / "tiny"
    tiny_model(directory)
    (app,) = yaml.safe_load((root / "serve_config.yaml").read_text())["applications"]
    args = dict(app["args"], model=str(directory), compilation_cache_dir=None)
    args["warmup_workload"] = {"query_tokens": [8, 32], "item_tokens": [4, 8], "items": 4,
                               "labels": 4}  # fmt: skip
    args["completion_warmup_shapes"] = [[0, 5, 48, 1]]
    settings = ReplicaSettings.from_mapping(args)
    replica = ScoringReplica.func_or_class(settings, "replicas.engine.scoring_engine:ScoringEngine")
    service = ScoringService.from_settings(settings)

    async def backend(work: Any) -> Any:
        return await replica.score_timed(work)

    async def health() -> None:
        return None

    api = build_api(service, backend, health)

    async def post(body: dict[str, Any]) -> Any:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://walk") as client:
            headers = {"content-type": "application/json"}
            reply = await client.post("/v1/score", content=json.dumps(body), headers=headers)
        if reply.status_code != 200:
            raise RuntimeError(f"/v1/score answered {reply.status_code}: {reply.text}")
        return reply.json()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(post(WARM))
    sys.setprofile(profile)
    recording.set()
    loop.run_until_complete(post(COLD))
    recording.clear()
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    print(json.dumps(calls))
    os._exit(0)  # the replica's threads and Serve's batch tasks are not shut down


WORKLOAD = Workload(options=(Option("--trees", str(ROOT)),), measure=measure)

if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    child()
