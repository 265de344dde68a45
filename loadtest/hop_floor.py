"""Ray Serve's own floor for scorejax's two request paths (loadtest.bench_hop): a FastAPI
ingress deployment that answers a constant (client, Serve's proxy, an ingress replica) and
one that awaits a handle call to a second deployment returning its argument (one more hop).
No scorejax code runs in it, so the two routes time Serve on this machine, nothing of ours.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

APP_NAME = "hop-floor"
ROUTE_PREFIX = "/hop-floor"
floor_api = FastAPI()


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class Echo:
    async def echo(self, value: Any) -> Any:
        return value


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
@serve.ingress(floor_api)
class FloorIngress:
    def __init__(self, echo: DeploymentHandle) -> None:
        self._echo = echo

    @floor_api.get("/constant")
    async def constant(self) -> dict[str, int]:
        return {"ok": 1}

    @floor_api.get("/handle")
    async def handle(self) -> dict[str, int]:
        return {"ok": await self._echo.echo.remote(1)}


def deploy_floor() -> None:
    """Deploy the floor app beside the running server's (the same cluster and proxy)."""
    serve.run(
        FloorIngress.bind(Echo.bind()), name=APP_NAME, route_prefix=ROUTE_PREFIX, blocking=False
    )


def delete_floor() -> None:
    serve.delete(APP_NAME)
