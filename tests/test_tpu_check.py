"""planning.tpu_check: TPU serve plans compiled here with compile-only libtpu, no TPU.

The shipped TPU configs (cluster/manifests) compile for their slices with production model
configs, every step within HBM, the Pallas item attention included (the default on TPU); a
plan that cannot fit is refused before compiling. Compiles run in subprocesses: the tool must
set libtpu's environment before jax is imported. CI compiles each kind's smallest signature
(docs/tpu.md has every signature's figures, from the same tool with ``--signatures all``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cluster.tpu_topology import GIB, ChipSpec, axes_crossing_hosts, libtpu_path
from planning.tpu_check import DEFAULT_CONFIGS, serve_args
from planning.tpu_projection import project_step, step_flops
from replicas.engine.layouts.shared_prefix import PrefixDims
from replicas.engine.layouts.stream import StreamDims
from replicas.model.catalog import model_config
from replicas.model.flops import multi_item_flops, token_flops

ROOT = Path(__file__).resolve().parents[1]


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "plan.json"
    command = [sys.executable, "-m", "planning.tpu_check", *args, "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return done, json.loads(out.read_text()) if out.exists() else None


def test_libtpu_is_installed_by_the_set_up() -> None:
    assert libtpu_path().name == "libtpu.so"


@pytest.mark.parametrize(
    ("topology", "model", "crossing"),
    [
        # Each slice of the two manifests once, each model family once (a pair is ~20 s of
        # the suite's budget; `python -m planning.tpu_check` checks any other by hand).
        ("v6e:2x2", "Qwen3-0.6B", []),
        ("v6e:4x4", "Llama-3.2-1B", ["data"]),
    ],
)
def test_the_shipped_tpu_configs_compile_for_their_slices(
    tmp_path: Path, topology: str, model: str, crossing: list[str]
) -> None:
    done, plan = run_check(
        tmp_path, "--topology", topology, "--model", model, "--signatures", "smallest"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert plan is not None and plan["fits"]
    manifest_mesh = tuple(serve_args(DEFAULT_CONFIGS[topology])["mesh_shape"])
    assert tuple(plan["mesh"]) == manifest_mesh
    assert plan["hosts"] == {"v6e:2x2": 1, "v6e:4x4": 4}[topology]
    assert plan["crossing"] == crossing  # the model axis stays inside a host
    assert {step["kind"] for step in plan["steps"]} == {"prefix", "items", "rows"}
    for step in plan["steps"]:
        assert step["argument_bytes"] > 0 and step["xla_flops"] > 0
        assert plan["param_bytes"] + step["step_bytes"] < plan["hbm_bytes"]
    # Parameters really are split four ways on the model axis (bf16, 2 bytes each).
    config = model_config(model)
    assert plan["param_bytes"] < 2 * parameter_count(config) / 3
    assert "fits: yes" in done.stdout


def parameter_count(config) -> int:
    import jax

    from replicas.model.causal_lm import CausalLM

    shapes = jax.eval_shape(CausalLM(config).init_params, jax.random.key(0))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))


def test_a_plan_that_cannot_fit_is_refused_before_compiling(tmp_path: Path) -> None:
    done, plan = run_check(tmp_path, "--topology", "v6e:2x2", "--model", "Llama-3.1-70B")
    assert done.returncode == 1, done.stdout + done.stderr
    assert plan is not None and not plan["fits"] and plan["steps"] == []
    assert plan["param_bytes"] > 32 * GIB  # 70.6e9 bf16 parameters over 4 chips
    assert "fits: NO" in done.stdout and "against 32 GiB of a v6e chip" in done.stdout


def test_an_unknown_topology_names_the_option(tmp_path: Path) -> None:
    done, _ = run_check(tmp_path, "--topology", "v6e:3x7", "--model", "Qwen3-0.6B")
    assert done.returncode == 2
    assert "--topology" in done.stderr


def test_axes_crossing_hosts_from_each_devices_process() -> None:
    from jax.sharding import Mesh

    def device(process: int) -> SimpleNamespace:
        return SimpleNamespace(process_index=process)

    grid = np.array([[device(0), device(0)], [device(1), device(1)]], dtype=object)
    mesh = SimpleNamespace(devices=grid, axis_names=("data", "model"))
    assert axes_crossing_hosts(mesh) == ["data"]
    mesh = SimpleNamespace(devices=grid.T, axis_names=("data", "model"))
    assert axes_crossing_hosts(mesh) == ["model"]
    assert Mesh  # the real Mesh has the same two attributes


def test_projected_flops_are_the_model_flops_plus_the_padded_attention() -> None:
    c = model_config("Qwen3-0.6B")
    # Items step, one request: 3 items of 4 tokens behind an 8-token query, window 4.
    dims = StreamDims(batch=1, prefix=8, tokens=12, window=4, labels=2)
    padded = step_flops(c, "items", dims, rows=3)
    useful = multi_item_flops(c, 8, [4, 4, 4]) - sum(token_flops(c, t + 1) for t in range(8))
    # Every item token k really reads 8 + k + 1 keys; the step reads T + 2W = 16.
    extra_keys = 3 * sum(16 - (8 + k + 1) for k in range(4))
    assert padded - useful == 4 * extra_keys * c.num_heads * c.head_dim * c.num_layers


def test_the_roofline_is_the_slower_of_compute_and_memory() -> None:
    config = model_config("Qwen3-0.6B")
    chip = ChipSpec("x", 16 * GIB, peak_flops=1e12, hbm_bandwidth=1e12)
    dims = PrefixDims(1, 16)
    cost = project_step(config, "prefix", dims, 0, chip, 1, 10**9, 2)
    assert cost.seconds == max(cost.flops / 1e12, cost.bytes / 1e12)
    halved = project_step(config, "prefix", dims, 0, chip, 2, 10**9, 2)
    assert halved.flops == cost.flops / 2
