"""planning.tpu_check: TPU serve plans compiled here with compile-only libtpu, no TPU.

The shipped app with its TPU args compiles for whole slices with production model configs,
every step within HBM, the Pallas item attention included (the default on TPU); a plan that
cannot fit is refused before compiling. Compiles run in subprocesses: the tool must set
libtpu's environment before jax is imported. CI compiles each kind's smallest signature
(docs/tpu.md has every signature's figures, from the same tool with ``--signatures all``).
planning.plan's command-line refusals before compiling (a bad ``--mesh``, a model too big
for the slice) load the same deviceless topology, so they are here too.
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
from planning.compiled_cost import ChipCost, every_layer, ici_bytes
from planning.tpu_projection import step_flops
from replicas.engine.layouts.shared_prefix import PrefixDims
from replicas.engine.layouts.stream import StreamDims
from replicas.model.catalog import model_config
from replicas.model.flops import multi_item_flops, token_flops
from tests.support.background import Command

ROOT = Path(__file__).resolve().parents[2]
# After the Serve modules: the checks compile in the background all the while (nice 19, so
# the Serve tests' workers, at niceness 0, take the CPU whenever they want it).
pytestmark = pytest.mark.after_serve


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "plan.json"
    command = [sys.executable, "-m", "planning.tpu_check", *args, "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return done, json.loads(out.read_text()) if out.exists() else None


def test_libtpu_is_installed_by_the_set_up() -> None:
    assert libtpu_path().name == "libtpu.so"


BATCHED = 4  # requests per step of the projected row: one per chip of v6e:4x4's data axis
PROJECTED = ["--projection", "--workloads", "batched", "--batched", str(BATCHED)]
CHECKS = {
    # Qwen3-0.6B on one host, with the projection of BATCHED requests per step (its steps
    # compiled twice more: as served, and with no layers). The whole v6e-16 slices (Qwen3 and
    # the Llama family) are the deep tier's (test_tpu_check_slices.py). The other rows (one
    # request per step; the 16 of the largest batch bucket, which the manifest test's re-plan
    # projects; one request of 1000 items, whose spread over the data axis
    # tests/engine/test_data_axis.py holds on CPU meshes) are what the tool prints by default
    # and docs/tpu.md shows: the same code, more CPU-s here (16 requests: 53 CPU-s for the
    # v6e:2x2 check, 4: 33).
    ("v6e:2x2", "Qwen3-0.6B"): PROJECTED,
}


def check_commands(folder: Path, checks: dict[tuple[str, str], list[str]]) -> dict[str, Command]:
    """``planning.tpu_check`` for each (topology, model) of ``checks``, each its own
    compile-only libtpu process, keyed as ``read_plans`` reads them."""
    commands = {}
    for (topology, model), extra in checks.items():
        out = folder / f"{topology}-{model}.json"
        args = [sys.executable, "-m", "planning.tpu_check", "--topology", topology]
        args += ["--model", model, "--signatures", "smallest", "--json", str(out), *extra]
        commands[f"tpu_check {topology} {model}"] = Command(tuple(args), out, niceness=19)
    return commands


def read_plans(background: dict, checks: dict) -> dict[tuple[str, str], tuple[str, dict]]:
    """Each check's stdout and JSON plan, once its background compile is done."""
    results = {}
    for topology, model in checks:
        done = background[f"tpu_check {topology} {model}"].result(timeout_s=900)
        assert done.returncode == 0, done.stdout
        results[(topology, model)] = (done.stdout, json.loads(done.out.read_text()))
    return results


def background_commands(folder: Path) -> dict[str, Command]:
    """The checks, started in the background when collection ends (tests/support/background.py)."""
    return check_commands(folder, CHECKS)


@pytest.fixture(scope="module")
def plans(background: dict) -> dict[tuple[str, str], tuple[str, dict]]:
    return read_plans(background, CHECKS)


def assert_compiles_for_whole_slices(
    stdout: str, plan: dict, topology: str, model: str, crossing: list[str]
) -> None:
    """The plan fits, on the slice's mesh and hosts, the model axis inside a host, every step
    within HBM with its Pallas calls, the parameters split four ways."""
    assert plan["fits"]
    assert tuple(plan["mesh"]) == {"v6e:2x2": (1, 4), "v6e:4x4": (4, 4)}[topology]
    assert plan["hosts"] == {"v6e:2x2": 1, "v6e:4x4": 4}[topology]
    assert plan["crossing"] == crossing  # the model axis stays inside a host
    assert {step["kind"] for step in plan["steps"]} == {"prefix", "items", "rows"}
    for step in plan["steps"]:
        assert step["argument_bytes"] > 0 and step["xla_flops"] > 0
        # The item stream's attention is the two Pallas kernels (the items against the
        # prefix, the items among themselves); the prefix and dense-row steps hold none.
        assert step["pallas_calls"] == (2 if step["kind"] == "items" else 0), step["dims"]
        assert plan["param_bytes"] + step["step_bytes"] < plan["hbm_bytes"]
    # Parameters really are split four ways on the model axis (bf16, 2 bytes each).
    config = model_config(model)
    assert plan["param_bytes"] < 2 * parameter_count(config) / 3
    assert "fits: yes" in stdout


def test_the_tpu_config_compiles_for_one_host(plans: dict) -> None:
    stdout, plan = plans[("v6e:2x2", "Qwen3-0.6B")]
    assert_compiles_for_whole_slices(stdout, plan, "v6e:2x2", "Qwen3-0.6B", [])


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


def test_a_bad_option_names_itself(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "planning.plan", "--topology", "v6e:2x2", "--model"]
    done = subprocess.run(
        [*command, "Qwen3-0.6B", "--mesh", "3,3"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--mesh" in done.stderr


LLAMA_70B = """
import json, sys
from planning.layouts import Layout
from planning.plan import main, parse_args
from planning.planner import Planner
# bfloat16: every layout refused; then int8's weights on the one replica of all 4 chips
code = main(["--topology", "v6e:2x2", "--model", "Llama-3.1-70B", "--json", sys.argv[1]])
options = parse_args(["--topology", "v6e:2x2", "--model", "Llama-3.1-70B",
                      "--quantization", "int8"])
planner = Planner(options)
_, _, params, engine = planner.engine(Layout(4, 1, (1, 4), 1))
print(json.dumps({"code": code, "params": params, "cache": engine.query_cache_bytes}))
"""


@pytest.mark.deep
def test_llama_70b_on_a_v6e_2x2_is_refused_in_bfloat16_before_compiling_and_fits_in_int8(
    tmp_path: Path,
) -> None:
    # Llama-3.1-70B's bf16 weights are 141 GB: 35 GB per chip even on a v6e:2x2's 4 chips;
    # in int8 (values + float32 scales; embeddings and LM head stay bfloat16) about 0.63x.
    # One process: the planner's CLI, then its weight count (abstract_params) for int8.
    out = tmp_path / "plan.json"
    command = [sys.executable, "-c", LLAMA_70B, str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    int8 = json.loads(done.stdout.splitlines()[-1])
    assert int8["code"] == 1 and "no layout fits" in done.stderr
    plan = json.loads(out.read_text())
    assert len(plan["rows"]) == 6 and not any(r["fits"] for r in plan["rows"])
    assert all("parameters + query cache" in r["reason"] for r in plan["rows"])
    assert "plan_s" not in plan["rows"][0]  # refused before any compile
    (bf16,) = [r for r in plan["rows"] if r["mesh"] == [1, 4]]
    hbm = bf16["hbm_bytes_per_chip"]
    assert f"> HBM {hbm / 2**30:.1f} GiB (parameters" in bf16["reason"]
    assert "in bfloat16" in bf16["reason"]
    assert bf16["param_bytes_per_chip"] + bf16["cache_bytes_per_chip"] > hbm
    # int8: half of bf16's split weights, plus o whole on every chip (model.token_split: 80
    # layers x 64 MiB, 3.75 GiB more than a quarter each): 20.7 GiB of 32.
    assert int8["params"] + int8["cache"] < 0.7 * hbm
    assert 0.61 < int8["params"] / bf16["param_bytes_per_chip"] < 0.65


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


def test_collective_bytes_are_read_from_hlo_lines() -> None:
    # all-reduce of 4 x 8 f32 (128 B) over groups of 2: a ring sends 2 (n - 1) / n = 1x.
    reduce = "%ar = f32[4,8]{1,0} all-reduce(%x), replica_groups={{0,1},{2,3}}, to_apply=%add"
    assert ici_bytes(reduce) == 128
    # all-gather to 4 x 2 s32 (32 B) over the 4 devices of mesh axis_0: 3/4 of the output.
    gather = (
        "%ag = s32[4,2]{1,0} all-gather(%b), channel_id=10, "
        "replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}, dimensions={0}"
    )
    assert ici_bytes(gather) == 24
    # An async start returns (operand, output): the output (8 x 16 bf16, 256 B), iota groups
    # of 4 -> 3/4 of it; its -done and a fusion that only names an all-reduce count nothing.
    start = (
        "%s = (bf16[2,16]{1,0}, bf16[8,16]{1,0}) all-gather-start(%y), "
        "replica_groups=[2,4]<=[8], dimensions={0}"
    )
    done = "%d = bf16[8,16]{1,0} all-gather-done(%s)"
    fused = "%f = f32[4]{0} fusion(%all-reduce.1), kind=kLoop"
    assert ici_bytes("\n".join([start, done, fused])) == 192


def test_a_step_of_every_layer_is_the_bare_step_plus_each_layer() -> None:
    """The served step counts its loop body (one layer) once; the step compiled with no
    layers counts the rest: every layer is ``bare + layers * (served - bare)``, FLOPs and
    collectives; the bytes are the served executable's (every layer's parameters in it)."""
    served, bare = ChipCost(16.0, 130.0, 6.0), ChipCost(10.0, 100.0, 4.0)
    assert every_layer(served, bare, 28) == ChipCost(10 + 28 * 6, 130, 4 + 28 * 2)
    assert every_layer(served, bare, 1) == served
    assert every_layer(bare, bare, 5) == bare  # a step with nothing in its layers
    chip = ChipSpec("x", 16 * GIB, peak_flops=1e12, hbm_bandwidth=1e12, ici_bandwidth=1e11)
    cost = ChipCost(2e12, 1e12, 1e10)
    assert cost.seconds(chip) == max(2.0, 1.0) + 0.1
    # int8 (W8A8): a layer's projection FLOPs run at the int8 peak, the rest at bf16's
    assert every_layer(served, bare, 28, 0.75) == ChipCost(178, 130, 60, 28 * 6 * 0.75)
    int8_chip = ChipSpec("x", 16 * GIB, 1e12, 1e12, 1e11, int8_peak_flops=2e12)
    assert ChipCost(2e12, 1e12, 1e10, 1e12).seconds(int8_chip) == 1.0 + 0.5 + 0.1
    assert ChipCost(2e12, 1e12, 1e10, 1e12).seconds(chip) == 2.0 + 0.1  # no int8 MXU


def test_the_int8_share_is_the_projections_part_of_a_layers_flops() -> None:
    from planning.tpu_projection import int8_share

    # Qwen3-0.6B's shapes; a prefix step of 16 x 320 tokens
    c = SimpleNamespace(hidden_size=1024, num_heads=16, num_kv_heads=8, head_dim=128,
                        intermediate_size=3072, num_layers=28, quantization="none",
                        encoder=False, rotary=False)  # fmt: skip
    dims = SimpleNamespace(batch=16, tokens=320)
    assert int8_share(c, "prefix", dims) == 0.0  # quantization: none
    # per token: 2 x (q, k, v, o and the MLP's weights) against QK^T and PV over 320 keys
    per_layer = (1024 * (16 + 2 * 8) * 128 + 16 * 128 * 1024 + 3 * 1024 * 3072) * 2
    attention = 4 * 320 * 16 * 128
    expected = per_layer / (per_layer + attention)
    q8 = SimpleNamespace(**(vars(c) | {"quantization": "int8"}))
    assert int8_share(q8, "prefix", dims) == pytest.approx(expected, rel=1e-12)


def steps_of(plan: dict, items: int, batch: int) -> dict[tuple[str, tuple[int, ...]], dict]:
    row = next(r for r in plan["projection"] if r["shape"][1] == items and r["batch"] == batch)
    return {(step["kind"], tuple(step["dims"])): step for step in row["steps"]}


def assert_flops_add_up(plan: dict) -> None:
    """Each projected step's FLOPs per chip, times the chips, are the analytic FLOPs."""
    config = model_config("Qwen3-0.6B")
    chips = plan["mesh"][0] * plan["mesh"][1]
    for (kind, dims), step in steps_of(plan, 10, BATCHED).items():
        shaped = StreamDims(*dims) if kind == "items" else PrefixDims(*dims)
        analytic = step_flops(config, kind, shaped, 10 * BATCHED if kind == "items" else 0)
        # Every layer counted (the scanned step and the step with no layers), the Pallas
        # kernels by their cost estimates; XLA adds norms, softmax and the like on top.
        assert 0.95 <= step["flops_per_chip"] * chips / analytic <= 1.15, kind


def test_compiled_flops_per_chip_add_up_to_the_analytic_flops(plans: dict) -> None:
    assert_flops_add_up(plans[("v6e:2x2", "Qwen3-0.6B")][1])


def test_int8_on_the_model_axis_sends_under_bf16s_bytes(plans: dict, tmp_path: Path) -> None:
    """int8 on the shipped ``[1, 4]`` (model.token_split): per layer two int8 all-gathers, o's
    int8 all-to-all and down's bf16 reduce-scatter, where bf16 all-reduces twice; compiled for
    the slice, the projected steps send under bf16's bytes and run faster (docs/quantization.md,
    "On the model axis"). XLA's TPU compiler keeps a small reduce-scatter as an all-reduce
    (the items step's ``bf16[4,112,1024]`` here), so that step gains less."""
    done, int8 = run_check(
        tmp_path, "--topology", "v6e:2x2", "--model", "Qwen3-0.6B", "--signatures", "smallest",
        "--quantization", "int8", *PROJECTED,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    bf16 = plans[("v6e:2x2", "Qwen3-0.6B")][1]
    ours, theirs = steps_of(int8, 10, BATCHED), steps_of(bf16, 10, BATCHED)
    sent = {key[0]: step["ici_bytes_per_chip"] / theirs[key]["ici_bytes_per_chip"]
            for key, step in ours.items()}  # fmt: skip
    rate = {name: steps_rate(plan) for name, plan in (("int8", int8), ("bf16", bf16))}
    print(f"\n[tpu_check] int8 / bf16 on [1, 4], {BATCHED} per step: ICI {sent}, items/s {rate}")
    assert sent["prefix"] < 0.6 and sent["items"] < 0.9, sent  # 0.57 and 0.83 measured
    # 1.77x at 16 requests per step (docs/quantization.md); 0.85x with int32 all-reduces
    assert rate["int8"] > 1.4 * rate["bf16"], rate


def steps_rate(plan: dict) -> float:
    return next(row["items_per_s"] for row in plan["projection"] if row["batch"] == BATCHED)
