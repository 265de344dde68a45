"""The data axis divides each step: a mesh with ``data`` = 2 scores like one device and each
device computes half of every step.

Runs tests/support/data_axis_check.py on 4 host devices in a subprocess (the XLA flag must be set
before jax initializes) and asserts on its JSON line: every layout, the query cache (the
second call repeats the first call's queries) and a 40-item request on ``[2, 1]`` and
``[2, 2]`` against ``[1, 1]``; per-device FLOPs of each compiled step against the same
signature with ``data`` = 1 and the same model axis.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.data_axis_check import LAYOUTS
from tests.support.fp32 import fp32_ratio
from tests.support.model_helpers import json_lines_on_host_devices

pytestmark = pytest.mark.deep

# A data axis changes each device's matmul shapes and so the order of some sums: bit-equality
# is not on offer from XLA across shapes, the float32 floor is (tests/support/fp32.py).


@pytest.fixture(scope="module")
def result(tiny_checkpoint) -> dict[str, Any]:
    (line,) = json_lines_on_host_devices(
        "tests.support.data_axis_check", str(tiny_checkpoint("qwen3"))
    )
    return line


def worst_ratio(scores: list, reference: list) -> float:
    """The worst difference over the calls' works, as a fraction of the float32 floor."""
    worst = 0.0
    for call, call_reference in zip(scores, reference, strict=True):
        for got, want in zip(call, call_reference, strict=True):
            worst = max(worst, fp32_ratio(got, want))
    return worst


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mesh", ["2x1", "2x2"])
def test_a_data_axis_scores_like_one_device(result: dict, layout: str, mesh: str) -> None:
    assert result["devices"] == 4
    scores = result["scores"]
    reference = scores[f"1x1/{layout}"]
    sharded = scores[f"{mesh}/{layout}"]
    worst = worst_ratio(sharded["scores"], reference["scores"])
    print(f"\n[data axis] {layout} on {mesh}: worst difference from one device {worst:.2f}x floor")
    assert worst <= 1.0
    assert sharded["cache_hits"] == reference["cache_hits"]  # the cache serves the same hits
    if layout == "shared_prefix":
        assert sharded["cache_hits"] >= 3  # the second call's queries all came from it


@pytest.mark.parametrize("mesh", ["2x1", "1x2", "2x2"])
def test_prompt_log_probs_on_a_data_axis_equal_one_device(result: dict, mesh: str) -> None:
    prompts = result["prompts"]
    reference, sharded = prompts["1x1"], prompts[mesh]
    worst = 0.0
    for call, call_reference in zip(sharded["answers"], reference["answers"], strict=True):
        for work, work_reference in zip(call, call_reference, strict=True):
            for got, want in zip(work, work_reference, strict=True):
                for a, b in zip(got, want, strict=True):
                    worst = max(worst, fp32_ratio(a, b))
    print(f"\n[data axis] prompt log-probs on {mesh}: worst difference {worst:.2f}x floor")
    assert worst <= 1.0
    # The second call reads every prefix from the cache: the 32 context tokens 4 times and
    # the 32- and 48-token prefixes of the 35- and 50-token prompts; the first call shares
    # the context among its 4 choices (3 reads).
    assert (
        sharded["reused_prefix_tokens"]
        == reference["reused_prefix_tokens"]
        == 3 * 32 + (4 * 32 + 32 + 48 + 16)
    )


@pytest.mark.parametrize("mesh", ["2x1", "1x2", "2x2"])
def test_an_extended_query_on_a_data_axis_scores_like_one_device(result: dict, mesh: str) -> None:
    reference, sharded = result["extensions"]["1x1"], result["extensions"][mesh]
    worst = worst_ratio([sharded["scores"]], [reference["scores"]])
    print(f"\n[data axis] extended queries on {mesh}: worst difference {worst:.2f}x floor")
    assert worst <= 1.0
    assert sharded["reused_prefix_tokens"] == reference["reused_prefix_tokens"] == 2 * 48


def test_each_device_computes_half_of_every_step(result: dict) -> None:
    costs = result["costs"]
    assert {cost["kind"] for cost in costs} == {"prefix", "items", "rows", "dense"}
    for cost in costs:
        loop, loop_1 = cost["score_loop_flops"], cost["score_loop_flops_data_1"]
        ratio = (cost["flops"] - loop) / (cost["flops_data_1"] - loop_1)
        step = f"{cost['layout']} {cost['mesh']} {cost['kind']} {cost['dims']}"
        print(f"[data axis] {step}: per-device FLOPs {ratio:.3f} of data = 1")
        assert 0 < ratio <= 1.1 / 2, cost


@pytest.mark.parametrize(("split", "whole"), [("2x1", "1x1"), ("2x2", "1x2")])
def test_each_query_keys_and_values_sit_on_one_data_shard(
    result: dict, split: str, whole: str
) -> None:
    """The query cache after the same calls: the busiest device of a data = 2 mesh holds
    about half the prefix keys/values of data = 1 (each entry on the block that computed
    it); and each compiled prefix step leaves half its keys/values per device."""
    scores = result["scores"]
    held = scores[f"{split}/shared_prefix"]["cache_bytes_per_device"]
    reference = scores[f"{whole}/shared_prefix"]["cache_bytes_per_device"]
    print(
        f"\n[data axis] cached K/V on the busiest device, {split}: {held} B, {whole}: {reference} B"
    )
    assert 0 < held <= 1.1 / 2 * reference
    mesh = [int(n) for n in split.split("x")]
    prefixes = [c for c in result["costs"] if c["kind"] == "prefix" and c["mesh"] == mesh]
    assert prefixes
    for cost in prefixes:
        assert cost["output_bytes"] <= 1.1 / 2 * cost["output_bytes_data_1"], cost
