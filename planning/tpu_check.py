"""``python -m planning.tpu_check``: compile a TPU serve plan here, without a TPU.

    python -m planning.tpu_check --topology v6e:4x4 --model Qwen3-8B

For a slice topology libtpu knows (v6e:2x2, v6e:4x4, v5e:2x2, v5e:4x4, v5p:2x2x1, ...), a
production model config (``replicas.model.catalog``) or a ``config.json``, and a TPU serve
config (by default the shipped serve_config.yaml with ``planning.serve_args.TPU_ARGS``):
shape-only bf16 parameters sharded by the one logical-axis table, the mesh a host group
builds over every host's chips (``--mesh``, else ``[hosts, chips per host]``), and every
step signature the config's warm-up compiles, lowered and compiled for the slice. Prints
per step the compile time, per-chip memory against HBM, XLA's FLOPs and bytes, and a roofline
projection at RFC-008's workload (300-token query, 10 items of 10 tokens). Exits 1 when the
plan does not fit in HBM (before compiling when the parameters alone do not), 2 on a bad
option.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cluster.tpu_topology import GIB, TopologyError, prepare_environment
from planning.serve_args import base_args
from planning.tpu_projection import WORKLOADS


@dataclass
class Plan:
    """What one check found; ``fits`` decides the exit code."""

    topology: str
    model: str
    chip: str
    mesh: tuple[int, int]
    hosts: int
    crossing: list[str]
    param_bytes: int
    cache_bytes: int
    hbm_bytes: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    projection: list[dict[str, Any]] = field(default_factory=list)
    projection_compile_s: dict[str, float] = field(default_factory=dict)  # by purpose
    adapter_bytes: int = 0  # of param_bytes: the LoRA slots' stacks (--max-loras)

    @property
    def need_bytes(self) -> int:
        extra = max((s["step_bytes"] for s in self.steps), default=0)
        return self.param_bytes + self.cache_bytes + extra

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.hbm_bytes


def replica_settings(args: argparse.Namespace, devices: list[Any]) -> Any:
    """The config's settings for this model and slice: bf16 unless set, no compilation cache
    (its signature record would add this machine's history), mesh from --mesh, else the
    config's when it uses every chip, else ``[hosts, chips per host]``."""
    from cluster.tpu_topology import default_mesh_shape, host_count
    from replicas.settings import ReplicaSettings

    config = Path(args.config) if args.config else None
    values = base_args(config)
    if args.mesh:
        mesh = tuple(int(n) for n in args.mesh.split(","))
    elif config and math.prod(values.get("mesh_shape") or [0]) == len(devices):
        mesh = tuple(values["mesh_shape"])
    else:
        mesh = default_mesh_shape(devices)
    values.update(
        model=args.model,
        mesh_shape=mesh,
        compilation_cache_dir=None,
        hosts_per_replica=host_count(devices),
        attention=args.attention,
    )
    values.setdefault("dtype", "bfloat16")
    values = with_quantization(values, args)  # int8: the layers' weights in half the bytes
    if args.signatures != "all":  # one batch size: the largest, or the smallest
        sizes = values.get("warmup_batch_sizes", [1])
        values["warmup_batch_sizes"] = [max(sizes) if args.signatures == "largest" else min(sizes)]
        values["limit_to_warmup"] = False  # a subset of the warm-up is checked, not served
    return ReplicaSettings.from_mapping(values)


def served_model(name: str, dtype: str, quantization: str) -> Any:
    """The model a replica of these settings serves: the catalog's (or a ``config.json``'s)
    config with the ``quantization`` setting, in ``dtype``. ``abstract_params`` of it counts
    the weights as a replica places them (int8 values and float32 scales for ``int8``); the
    planner and ``tpu_check`` both take the model from here."""
    import jax.numpy as jnp

    from replicas.checkpoints.loading import DTYPES
    from replicas.model.catalog import model_config
    from replicas.model.classes import model_for

    config = model_config(name).replace(quantization=quantization)
    return model_for(config, jnp.dtype(DTYPES[dtype]))  # an Encoder for BERT-like configs


def with_quantization(values: dict[str, Any], options: argparse.Namespace) -> dict[str, Any]:
    """A config's args with ``--quantization`` over them, when given."""
    chosen = getattr(options, "quantization", None)
    return values | {"quantization": chosen} if chosen else values


def abstract_params(model: Any, mesh: Any, lora: tuple[int, int] | None = None) -> tuple[Any, int]:
    """Shape-only parameters placed by ``param_shardings``, and their bytes per chip;
    ``lora`` (max_loras, max_lora_rank): with the adapter slots' stacks as a replica holds
    them (``params["lora"]``, sharded by the same table), so every step compiles with the
    low-rank update and the bytes count the slots."""
    import jax

    from replicas.model.params import param_shardings

    shapes = jax.eval_shape(model.init_params, jax.random.key(0))
    shardings = param_shardings(model.config, mesh)
    params = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )
    if lora:
        params = {**params, "lora": abstract_lora(model, mesh, *lora)}
    return params, per_chip_bytes(params)


def abstract_lora(model: Any, mesh: Any, max_loras: int, rank: int) -> Any:
    """``params["lora"]`` of ``max_loras`` slots (and the base's) at ``rank``, shape-only."""
    import jax

    from cluster.sharding import tree_shardings
    from replicas.model.lora import lora_logical_axes, lora_shapes

    shapes = lora_shapes(model.config, max_loras + 1, rank)
    shardings = tree_shardings(lora_logical_axes(model.config), shapes, mesh)
    return jax.tree.map(
        lambda shape, sharding: jax.ShapeDtypeStruct(shape, model.dtype, sharding=sharding),
        shapes,
        shardings,
        is_leaf=lambda node: isinstance(node, tuple),
    )


def per_chip_bytes(tree: Any) -> int:
    """Bytes of the shape-only arrays of ``tree`` on the chip holding the most."""
    import jax
    import numpy as np

    return sum(
        int(np.prod(p.sharding.shard_shape(p.shape))) * p.dtype.itemsize
        for p in jax.tree.leaves(tree)
    )


def config_slots(settings: Any) -> tuple[int, int] | None:
    """The adapter slots a config's ``max_loras`` asks for (None: LoRA off)."""
    return (
        (settings.adapters.max_loras, settings.adapters.max_lora_rank)
        if settings.adapters.max_loras
        else None
    )


def lora_slots(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--max-loras`` and ``--max-lora-rank``: adapter slots to plan for (None: LoRA off)."""
    if args.max_loras < 0 or args.max_lora_rank < 1:
        raise ValueError("--max-loras must be >= 0 and --max-lora-rank >= 1")
    return (args.max_loras, args.max_lora_rank) if args.max_loras else None


def chosen_keys(engine: Any, signatures: str) -> list[tuple[str, Any]]:
    """Every warm-up signature, or per kind the most (or least) expensive one."""
    keys = engine.warmup_keys()
    if signatures == "all":
        return keys
    sign = 1 if signatures == "largest" else -1
    chosen: dict[str, tuple[str, Any]] = {}
    for kind, dims in keys:
        if kind not in chosen or sign * (dims.cost - chosen[kind][1].cost) > 0:
            chosen[kind] = (kind, dims)
    return list(chosen.values())


def step_row(
    kind: str, dims: Any, compiled: Any, seconds: float | None, params: int
) -> dict[str, Any]:
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    args = int(memory.argument_size_in_bytes)
    out, temp = int(memory.output_size_in_bytes), int(memory.temp_size_in_bytes)
    alias, code = int(memory.alias_size_in_bytes), int(memory.generated_code_size_in_bytes)
    return {
        "kind": kind,
        "dims": list(dims.astuple()),
        "compile_s": None if seconds is None else round(seconds, 1),
        "argument_bytes": args,
        "output_bytes": out,
        "temp_bytes": temp,
        "code_bytes": code,
        # Beyond the resident parameters: inputs, outputs, temporaries, code.
        "step_bytes": args - params + out + temp - alias + code,
        "pallas_calls": compiled.as_text().count('custom_call_target="tpu_custom_call"'),
        "xla_flops": float(cost.get("flops", 0.0)),
        "xla_bytes": float(cost.get("bytes accessed", 0.0)),
    }


def compile_steps(engine: Any, keys: list[tuple[str, Any]], plan: Plan) -> None:
    for key in keys:
        before = set(engine.executables())
        start = time.perf_counter()
        engine.compile_keys([key])
        seconds = time.perf_counter() - start
        for new_key, compiled in engine.executables().items():
            if new_key not in before:  # a nested prefix step compiles inside its items step
                spent = seconds if new_key == key else None
                plan.steps.append(step_row(*new_key, compiled, spent, plan.param_bytes))
                print(format_step(plan.steps[-1], plan.hbm_bytes), flush=True)


def format_projection(row: dict[str, Any]) -> str:
    if row["kind"] == "embed":
        (step,) = row["steps"]
        return (
            f"  projected, an embed step {tuple(step['dims'])} (batch, tokens, window): "
            f"{row['tokens_per_s']:.0f} tokens/s, {step['ms']:.3f} ms a step "
            f"({step['flops_per_chip']:.3g} FLOP, {step['hbm_bytes_per_chip']:.3g} B, "
            f"collectives {step['collective_ms']:.3f} ms per chip)"
        )
    query, items, item_tokens, _ = row["shape"]
    steps = ", ".join(
        f"{step['runs']}x {step['kind']} {tuple(step['dims'])} {step['ms']:.3f} ms "
        f"({step['flops_per_chip']:.3g} FLOP, {step['hbm_bytes_per_chip']:.3g} B, "
        f"collectives {step['collective_ms']:.3f} ms per chip)"
        for step in row["steps"]
    )
    return (
        f"  projected, {row['batch']} request(s) of a {query}-token query + {items} items of "
        f"{item_tokens} tokens per step: {row['items_per_s']:.0f} items/s cold, "
        f"{row['items_per_s_cached_query']:.0f} with the query cached, "
        f"{row['latency_s'] * 1e3:.2f} ms per step set; {steps}"
    )


def format_step(row: dict[str, Any], hbm: int) -> str:
    mib = 1024**2
    spent = "(in the next)" if row["compile_s"] is None else f"{row['compile_s']:.1f} s"
    return (
        f"  {row['kind']:<7}{tuple(row['dims'])!s:<30}compile {spent:>13}  "
        f"args {row['argument_bytes'] / mib:>7.0f} MiB  out {row['output_bytes'] / mib:>6.0f} MiB  "
        f"temp {row['temp_bytes'] / mib:>6.0f} MiB  (step {row['step_bytes'] / hbm:.1%} of HBM)  "
        f"XLA {row['xla_flops']:.3g} FLOP, {row['xla_bytes']:.3g} B (scan body once)"
    )


def check(args: argparse.Namespace) -> Plan:
    from cluster.mesh import build_mesh
    from cluster.tpu_topology import axes_crossing_hosts, chip_spec, topology_devices
    from planning.compile_times import CompileTimes
    from planning.tpu_projection import project, project_embed
    from replicas.engine.scoring_engine import ScoringEngine

    devices = topology_devices(args.topology)
    chip = chip_spec(devices)
    settings = replica_settings(args, devices)
    placement = settings.placement
    mesh = build_mesh(placement.mesh_shape, devices)  # as a host group builds it
    model = served_model(args.model, settings.model.dtype, settings.model.quantization)
    lora = lora_slots(args) or config_slots(settings)
    settings = settings.replace(max_loras=0, lora_adapters=())  # the slots ride in params
    params, param_bytes = abstract_params(model, mesh, lora)
    plan = Plan(
        args.topology, args.model, chip.name, placement.mesh_shape, placement.hosts_per_replica,
        axes_crossing_hosts(mesh), param_bytes, settings.engine.query_cache_bytes, chip.hbm_bytes,
    )  # fmt: skip
    plan.adapter_bytes = per_chip_bytes(params["lora"]) if lora else 0
    print(header(plan, len(devices)), flush=True)
    if not plan.fits:
        return plan
    engine = ScoringEngine(model, params, mesh, settings, name=args.model)
    compile_steps(engine, chosen_keys(engine, args.signatures), plan)
    if args.projection:
        times = CompileTimes()
        with_slots = partial(abstract_params, lora=lora)
        if model.config.embeds:
            plan.projection = project_embed(engine, mesh, chip, with_slots, times)
        else:
            plan.projection = project(
                engine, mesh, chip, with_slots, times, args.workloads, args.batched
            )
        plan.projection_compile_s = times.totals()
    return plan


def header(plan: Plan, chips: int) -> str:
    crossing = ", ".join(plan.crossing) or "none (one host)"
    adapters = f" (LoRA slots {plan.adapter_bytes / GIB:.3f} GiB)" if plan.adapter_bytes else ""
    return (
        f"{plan.model} on {plan.topology}: {chips} {plan.chip} chips on {plan.hosts} host(s), "
        f"{plan.hbm_bytes / GIB:.0f} GiB HBM each; mesh [data, model] = {list(plan.mesh)}, "
        f"axes crossing hosts: {crossing}\n"
        f"  parameters {plan.param_bytes / GIB:.2f} GiB per chip{adapters}, query cache "
        f"{plan.cache_bytes / GIB:.2f} GiB per chip"
    )


def verdict(plan: Plan) -> str:
    need, hbm = plan.need_bytes / GIB, plan.hbm_bytes / GIB
    if plan.fits:
        return f"fits: yes, {need:.2f} GiB needed per chip of {hbm:.0f} GiB ({plan.chip})"
    return (
        f"fits: NO, {need:.2f} GiB needed per chip (parameters {plan.param_bytes / GIB:.2f} GiB"
        f" + query cache + the largest step) against {hbm:.0f} GiB of a {plan.chip} chip; "
        "use a slice with more chips on the model axis"
    )


def workload_list(text: str) -> tuple[str, ...]:
    """``--workloads``: names from WORKLOADS, comma-separated."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{unknown or text!r}: choose from {', '.join(WORKLOADS)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True, help="e.g. v6e:2x2, v6e:4x4, v5e:2x2")
    parser.add_argument("--model", default="Qwen3-0.6B", help="catalog name or config.json")
    parser.add_argument("--config", help="serve config or RayService manifest")
    parser.add_argument("--mesh", help="data,model (default: the config's, else hosts,chips)")
    parser.add_argument("--signatures", choices=("all", "largest", "smallest"), default="all")
    parser.add_argument("--attention", choices=("auto", "xla", "pallas"), default="auto")
    add_quantization_argument(parser)
    parser.add_argument("--libtpu", help="path of libtpu.so (default: found)")
    parser.add_argument("--json", help="write the plan as JSON here")
    add_lora_arguments(parser)
    parser.add_argument(
        "--projection",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="project RFC-008's workload and a 1000-item request (compiles each step as served "
        "and once more)",
    )
    parser.add_argument(
        "--workloads",
        type=workload_list,
        default=WORKLOADS,
        help="projection rows, comma-separated (default: all): single (RFC-008's workload, one "
        "request per step), batched (at the largest batch bucket), ranking (one request of "
        "1000 items)",
    )
    parser.add_argument(
        "--batched",
        type=positive_int,
        help="requests per step of the batched row (default: the largest batch bucket)",
    )
    return parser.parse_args(argv)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of requests, at least 1")
    return int(text)


def add_quantization_argument(parser: argparse.ArgumentParser) -> None:
    from replicas.settings.model import QUANTIZATIONS

    parser.add_argument(
        "--quantization", choices=QUANTIZATIONS,
        help="the layers' projections (default: the config's, else none; docs/quantization.md)",
    )  # fmt: skip


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-loras", type=int, default=0,
        help="LoRA adapter slots every step holds (semantics 21; 0: off): counted in HBM, "
        "and every step compiled with the low-rank update",
    )  # fmt: skip
    parser.add_argument("--max-lora-rank", type=int, default=16, help="rank of each slot")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prepare_environment(args.topology, args.libtpu)
        plan = check(args)
    except (TopologyError, ValueError) as error:
        print(f"tpu_check: {error}", file=sys.stderr)
        return 2
    for row in plan.projection:
        print(format_projection(row), flush=True)
    print(verdict(plan))
    if args.json:
        Path(args.json).write_text(json.dumps(vars(plan) | {"fits": plan.fits}, indent=1))
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
