"""One layout of a slice, planned: fit against HBM, then the workload projected.

``Planner`` holds what every layout of one slice and model shares (devices, chip, model
config, serve args); ``evaluate`` gives a layout's row (refused with the reason, or
projected), ``verify`` the winner's fit with every warm-up signature compiled.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

from cluster.tpu_topology import GIB, TopologyError
from planning.compile_times import CompileTimes
from planning.layouts import Layout, enumerate_layouts, replica_devices, replica_shape
from planning.serve_args import base_args
from planning.tpu_check import lora_slots


def layout_settings(args: dict[str, Any], model: str, layout: Layout) -> Any:
    from replicas.settings import ReplicaSettings

    values = dict(args) | {
        "model": model,
        "mesh_shape": list(layout.mesh),
        "hosts_per_replica": layout.hosts_per_replica,
        "compilation_cache_dir": None,  # its signature record would add this machine's history
    }
    return ReplicaSettings.from_mapping(values)


def refusal(row: dict[str, Any], reason: str) -> dict[str, Any]:
    return row | {"fits": False, "reason": reason}


def assumed_fit(row: dict[str, Any]) -> dict[str, Any]:
    """``--no-fit``: the layout taken as fitting, its need the parameters and query cache
    alone (no step compiled for it)."""
    need = row["param_bytes_per_chip"] + row["cache_bytes_per_chip"]
    return row | {"need_bytes_per_chip": need, "signatures": "none", "fits": True, "reason": ""}


def is_out_of_hbm(error: Exception) -> bool:
    """The TPU compiler's refusal of a step whose temporaries exceed HBM."""
    return "RESOURCE_EXHAUSTED" in str(error) and "HBM" in str(error)


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0].removeprefix("RESOURCE_EXHAUSTED: ")


def layout_row(layout: Layout) -> dict[str, Any]:
    return {
        "chips_per_replica": layout.chips_per_replica,
        "hosts_per_replica": layout.hosts_per_replica,
        "mesh": list(layout.mesh),
        "replicas_per_slice": layout.replicas_per_slice,
    }


class Planner:
    """What every layout of one slice and model shares: devices, chip, model, settings."""

    def __init__(self, options: argparse.Namespace) -> None:
        from cluster.tpu_topology import chip_spec, host_count, topology_devices
        from planning.tpu_check import served_model, with_quantization

        self.options = options
        self.devices = topology_devices(options.topology)
        self.chip = chip_spec(self.devices)
        self.hosts = host_count(self.devices)
        self.args = with_quantization(
            base_args(Path(options.config) if options.config else None), options
        )
        quantization = self.args.get("quantization", "none")
        self.model = served_model(options.model, self.args.get("dtype", "bfloat16"), quantization)
        self.config = self.model.config
        self.dtype_name = str(self.args.get("dtype", "bfloat16"))
        query, items, item_tokens = options.workload
        self.workload = (query, items, item_tokens, 2)
        self.lora = lora_slots(options)  # adapter slots every step holds, or None

    def layouts(self) -> list[Layout]:
        layouts = enumerate_layouts(len(self.devices), self.hosts)
        if self.options.mesh:
            layouts = [layout for layout in layouts if layout.mesh == self.options.mesh]
            if not layouts:
                raise ValueError(f"--mesh: {list(self.options.mesh)} is no layout of the slice")
        return layouts

    def replica_hosts(self, layout: Layout) -> list[Any]:
        """The devices of a topology of exactly the replica's hosts: the slice's for a whole
        slice, else the largest smaller topology libtpu knows with that many hosts."""
        from cluster.tpu_topology import host_count, topology_devices

        hosts = layout.hosts_per_replica
        if hosts == self.hosts:
            return self.devices
        generation, _, shape = self.options.topology.partition(":")
        per_host = len(self.devices) // self.hosts
        for candidate in replica_shape(shape, hosts * per_host):
            try:
                devices = topology_devices(f"{generation}:{candidate}")
            except TopologyError:
                continue
            if host_count(devices) == hosts:
                return devices
        raise TopologyError(f"--topology: no topology of {hosts} host(s) inside {shape}")

    def engine(self, layout: Layout) -> tuple[Any, Any, int, Any]:
        """The layout's engine over shape-only parameters: (engine, mesh, parameter bytes per
        chip, its engine settings); a ValueError when the weights cannot be sharded so."""
        from cluster.mesh import build_mesh
        from planning.tpu_check import abstract_params
        from replicas.engine.scoring_engine import ScoringEngine

        settings = layout_settings(self.args, self.options.model, layout)
        mesh = build_mesh(layout.mesh, replica_devices(self.replica_hosts(layout), layout))
        params, param_bytes = abstract_params(self.model, mesh, self.lora)
        settings = settings.replace(max_loras=0, lora_adapters=())  # the slots ride in params
        engine = ScoringEngine(self.model, params, mesh, settings, name=self.options.model)
        return engine, mesh, param_bytes, settings.engine

    def evaluate(self, layout: Layout) -> dict[str, Any]:
        """One layout's row: refused (with the reason) or projected."""
        start, times = time.perf_counter(), CompileTimes()
        row = layout_row(layout) | {"hbm_bytes_per_chip": self.chip.hbm_bytes}
        try:
            engine, mesh, param_bytes, engine_settings = self.engine(layout)
        except ValueError as error:  # a model axis the weights' shapes do not divide
            return refusal(row, f"parameters cannot be sharded so: {error}")
        cache = engine_settings.query_cache_bytes
        row |= {"param_bytes_per_chip": param_bytes, "cache_bytes_per_chip": cache}
        if param_bytes + cache > self.chip.hbm_bytes:
            return refusal(row, self.weights_refusal(param_bytes, cache))
        try:
            row = self.fit(engine, row, "largest", times) if self.options.fit else assumed_fit(row)
            if row["fits"]:
                row |= self.project(engine, mesh, layout, times)
        except Exception as error:  # re-raised unless it is the compiler's own HBM refusal
            if not is_out_of_hbm(error):
                raise
            row = refusal(row, f"the compiler ran out of HBM: {first_line(error)}")
        plan_s = round(time.perf_counter() - start, 1)
        spent = {"compile_s": times.totals(), "compile_cpu_s": times.totals("cpu_seconds")}
        return row | {"plan_s": plan_s} | spent

    def weights_refusal(self, param_bytes: int, cache: int) -> str:
        """Why a layout cannot hold the weights, with the numbers: the bytes per chip of the
        parameters in their ``quantization`` form and of the query cache against HBM."""
        form = self.config.quantization
        return (
            f"parameters + query cache {(param_bytes + cache) / GIB:.1f} GiB per chip > HBM "
            f"{self.chip.hbm_bytes / GIB:.1f} GiB (parameters {param_bytes / GIB:.1f} GiB in "
            f"{self.dtype_name if form == 'none' else form}, query cache "
            f"{cache / GIB:.1f} GiB)"
        )

    def fit(
        self, engine: Any, row: dict[str, Any], signatures: str, times: CompileTimes
    ) -> dict[str, Any]:
        """Parameters + query cache + the largest of ``signatures``' steps against HBM."""
        step = self.largest_step_bytes(engine, row["param_bytes_per_chip"], signatures, times)
        need = row["param_bytes_per_chip"] + row["cache_bytes_per_chip"] + step
        row = row | {"need_bytes_per_chip": need, "signatures": signatures}
        if need > self.chip.hbm_bytes:
            reason = f"parameters + query cache + largest step {need / GIB:.1f} GiB per chip > HBM"
            return refusal(row, reason)
        return row | {"fits": True, "reason": ""}

    def verify(self, layout: Layout, row: dict[str, Any]) -> dict[str, Any]:
        """The winner's fit with every warm-up signature compiled."""
        engine, *_ = self.engine(layout)
        checked = self.fit(engine, row, "all", CompileTimes())
        return checked if checked["fits"] else checked | {"reason": "winner: " + checked["reason"]}

    def largest_step_bytes(
        self, engine: Any, param_bytes: int, signatures: str, times: CompileTimes
    ) -> int:
        from planning.tpu_check import chosen_keys, step_row

        times.compile(engine, chosen_keys(engine, signatures), "fit")
        compiled = engine.executables().items()
        return max(step_row(*key, c, None, param_bytes)["step_bytes"] for key, c in compiled)

    def project(
        self, engine: Any, mesh: Any, layout: Layout, times: CompileTimes
    ) -> dict[str, Any]:
        """The workload at the largest batch bucket, per replica and per slice."""
        from planning.tpu_check import abstract_params
        from planning.tpu_projection import bare_engine, project_workload

        if self.config.embeds:
            return self.project_embed(engine, mesh, layout, times)
        batch = engine.settings.engine.batch_buckets[-1]
        bare = bare_engine(engine, mesh, partial(abstract_params, lora=self.lora))
        projected = project_workload(bare, engine, self.chip, self.workload, batch, times)
        cached = projected["items_per_s_cached_query"]
        return per_slice(layout, batch, projected["items_per_s"], cached) | {
            "step_latency_s": projected["latency_s"],
            "steps": projected["steps"],
        }

    def project_embed(
        self, engine: Any, mesh: Any, layout: Layout, times: CompileTimes
    ) -> dict[str, Any]:
        """An embedder or cross-encoder: its fullest embed step's tokens/s (every token
        counted real), as items of the workload's item tokens (a cross-encoder's: the query's
        too, each item one (query, item) pair) per second; no query to cache."""
        from planning.tpu_check import abstract_params
        from planning.tpu_projection import project_embed

        slots = partial(abstract_params, lora=self.lora)
        fullest = project_embed(engine, mesh, self.chip, slots, times)[-1]
        query, _, item_tokens, _ = self.workload
        head = self.config.head
        tokens = item_tokens + (query if head and head.kind == "cross_encoder" else 0)
        items = round(fullest["tokens_per_s"] / tokens, 1)
        batch = fullest["steps"][0]["dims"][0]
        return per_slice(layout, batch, items, items) | {
            "tokens_per_s_per_replica": fullest["tokens_per_s"],
            "step_latency_s": fullest["latency_s"],
            "steps": fullest["steps"],
        }


def per_slice(layout: Layout, batch: int, items: float, cached: float) -> dict[str, Any]:
    """A replica's projected items/s (cold and with the query cached) and the slice's."""
    return {
        "requests_per_step": batch,
        "items_per_s_per_replica": items,
        "items_per_s_per_slice": round(items * layout.replicas_per_slice, 1),
        "items_per_s_per_replica_cached_query": cached,
        "items_per_s_per_slice_cached_query": round(cached * layout.replicas_per_slice, 1),
    }
