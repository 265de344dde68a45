"""planning.tpu_check on whole v6e-16 slices (4 hosts of 4 chips), the deep tier's part of
tests/engine/test_tpu_check.py: Qwen3-0.6B with the projection (and on v6e:2x2 beside it,
to compare each chip's share), and the Llama family. Compile-only libtpu in the background,
as there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.test_tpu_check import (
    BATCHED,
    CHECKS,
    PROJECTED,
    assert_compiles_for_whole_slices,
    assert_flops_add_up,
    check_commands,
    read_plans,
    steps_of,
)
from tests.support.background import Command

pytestmark = [pytest.mark.after_serve, pytest.mark.deep]

SLICE_CHECKS = {
    **CHECKS,  # the same key as test_tpu_check's: one compile when both modules run
    ("v6e:4x4", "Qwen3-0.6B"): PROJECTED,
    ("v6e:4x4", "Llama-3.2-1B"): ["--no-projection"],
}


def background_commands(folder: Path) -> dict[str, Command]:
    return check_commands(folder, SLICE_CHECKS)


@pytest.fixture(scope="module")
def plans(background: dict) -> dict[tuple[str, str], tuple[str, dict]]:
    return read_plans(background, SLICE_CHECKS)


@pytest.mark.parametrize("model", ["Qwen3-0.6B", "Llama-3.2-1B"])
def test_the_tpu_config_compiles_for_a_whole_v6e_16_slice(plans: dict, model: str) -> None:
    stdout, plan = plans[("v6e:4x4", model)]
    assert_compiles_for_whole_slices(stdout, plan, "v6e:4x4", model, ["data"])


def test_compiled_flops_per_chip_add_up_to_the_analytic_flops_on_the_slice(plans: dict) -> None:
    assert_flops_add_up(plans[("v6e:4x4", "Qwen3-0.6B")][1])


def test_the_data_axis_divides_each_chips_share_on_a_slice(plans: dict) -> None:
    """v6e:4x4 [4, 4] against v6e:2x2 [1, 4], the same step signatures: each chip computes
    a quarter (``BATCHED`` requests per step, one per data shard)."""
    four = plans[("v6e:2x2", "Qwen3-0.6B")][1]
    sixteen = plans[("v6e:4x4", "Qwen3-0.6B")][1]
    assert [(row["shape"][1], row["batch"]) for row in sixteen["projection"]] == [(10, BATCHED)]
    whole, split = steps_of(four, 10, BATCHED), steps_of(sixteen, 10, BATCHED)
    shared = [key for key in split if key in whole]
    assert any(kind == "items" for kind, _ in shared)
    for key in shared:
        assert split[key]["flops_per_chip"] <= 1.1 / 4 * whole[key]["flops_per_chip"], key
