"""The scoring app's args a TPU plan starts from: a serve config's or a manifest's, or the
shipped ``serve_config.yaml``'s with the TPU args over them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cluster.tpu_topology import TopologyError

ROOT = Path(__file__).resolve().parents[1]
SERVE_CONFIG = ROOT / "serve_config.yaml"
TPU_ARGS = {
    # What a TPU replica changes in the shipped serve_config.yaml's args; the rest is kept.
    "dtype": "bfloat16",
    "batch_buckets": [1, 2, 4, 8, 16],
    "warmup_batch_sizes": [1, 16],
    "max_request_tokens": 1048576,  # tokens one request may ask for (CPU ships 32768)
    # none (bfloat16): int8 (W8A8, the MXU's int8 rate) misses the quality gate on SmolLM2
    # and no gate has run on the catalog's TPU models yet (docs/quantization.md). int8 where
    # bfloat16 does not fit: `python -m planning.plan --quantization int8` (Llama-3.1-70B on
    # a v6e:2x2), after `python -m loadtest run quant_quality --model ...` passes.
    "quantization": "none",
}
# Shipped args a TPU replica leaves at their defaults: completions are not warmed on TPU yet
# (their shapes compile on demand, docs/serving.md); a TPU plan compiles scoring's steps;
# fused steps pay where a pass is a weight read whatever its tokens (the CPU), and on TPU
# small requests batch into item-stream steps with the Pallas kernels instead; a TPU host's
# threads feed the chips and stay at the replica's niceness; a TPU replica's merged calls
# are bounded by max_batch_size alone (the merged-call bound in seconds is the CPU's
# latency guarantee, where one call of 16 requests takes seconds); the layer loop's auto
# unrolls small steps on a CPU only (a TPU's dot reads its layer out of the stack in place).
TPU_DROPPED = (
    "completion_warmup_shapes",
    "fused_step_tokens",
    "engine_niceness",
    "max_call_s",
    "layer_loop",
)


def serve_args(path: Path) -> dict[str, Any]:
    """The scoring app's ``args`` from a serve config or a KubeRay RayService manifest."""
    data = yaml.safe_load(path.read_text())
    if data.get("kind") == "RayService":
        data = yaml.safe_load(data["spec"]["serveConfigV2"])
    apps = [a for a in data["applications"] if a["import_path"] == "app.builder:build_app"]
    if len(apps) != 1:
        raise TopologyError(f"--config: {path} has no single app.builder:build_app application")
    return dict(apps[0].get("args") or {})


def base_args(config: Path | None) -> dict[str, Any]:
    """``--config``'s args, else the shipped serve_config.yaml's (less ``TPU_DROPPED``) with
    ``TPU_ARGS`` over them."""
    if config is not None:
        return serve_args(config)
    shipped = {k: v for k, v in serve_args(SERVE_CONFIG).items() if k not in TPU_DROPPED}
    return shipped | TPU_ARGS
