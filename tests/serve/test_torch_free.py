"""Serving processes keep torch out (``replicas.checkpoints.sources.keep_torch_out_of_actors``):
transformers 5 imports torch for ``AutoConfig`` and ``AutoTokenizer`` whenever it is
installed, and a Ray actor that serves (a Serve ingress or replica, a batch job's stage)
never runs it.

In an actor of the session's cluster: the tiny Llama's config and tokenizer load with torch
out, equal to this process's (which has torch); a GGUF's metadata, with an empty metadata
cache, converts in a subprocess into the same config, and its missing tokenizer is refused
with transformers' own reason. Outside an actor (this test's process) nothing changes. Every
Serve module of the suite runs its ingresses and replicas this way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import ray

from replicas.checkpoints.sources import (
    NO_TOKENIZER,
    convert_gguf_metadata,
    keep_torch_out_of_actors,
    load_hf_config,
    load_tokenizer,
    resolve_model_source,
)
from tests.support.model_helpers import write_gguf
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]
TEXT = "The capital of France is Paris."


@ray.remote(num_cpus=0.1)
class Loader:
    """Loads a model's config and tokenizer as a serving actor does."""

    def load(self, model: str, cache: str) -> dict[str, Any]:
        os.environ["SCOREJAX_CACHE_DIR"] = cache  # the GGUF's metadata: converted afresh
        kept_out = keep_torch_out_of_actors()
        source = resolve_model_source(model)
        config = load_hf_config(source).to_dict()
        try:
            ids, refused = load_tokenizer(source)(TEXT)["input_ids"], None
        except ValueError as error:
            ids, refused = None, str(error)
        torch = sys.modules.get("torch", "never imported")
        return {"kept_out": kept_out, "torch": repr(torch), "config": config, "ids": ids,
                "refused": refused}  # fmt: skip


def test_outside_an_actor_nothing_changes() -> None:
    import torch  # this process's reference computations need it

    assert not keep_torch_out_of_actors()
    assert sys.modules["torch"] is torch


def test_an_actor_loads_a_directory_without_torch(
    serve_cluster: ServeCluster,  # noqa: F811
    tiny_llama_dir: Path,
    tmp_path: Path,
) -> None:
    loader = Loader.remote()
    got = ray.get(loader.load.remote(str(tiny_llama_dir), str(tmp_path)), timeout=120)
    ray.kill(loader)
    assert got["kept_out"] and got["torch"] == "None", got["torch"]
    source = resolve_model_source(tiny_llama_dir)
    assert got["config"] == load_hf_config(source).to_dict()
    assert got["ids"] == load_tokenizer(source)(TEXT)["input_ids"]


@pytest.mark.deep
def test_an_actor_converts_a_gguf_in_a_subprocess(
    serve_cluster: ServeCluster,  # noqa: F811
    tiny_llama_dir: Path,
    tmp_path: Path,
) -> None:
    gguf = write_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    loader = Loader.remote()
    got = ray.get(loader.load.remote(str(gguf), str(tmp_path / "cache")), timeout=300)
    ray.kill(loader)
    assert got["kept_out"] and got["torch"] == "None", got["torch"]
    config, tokenizer = convert_gguf_metadata(resolve_model_source(gguf), tmp_path / "here")
    assert tokenizer is None  # a weights-only GGUF: transformers builds no tokenizer
    where = {"_name_or_path": None}  # the folder each was read from
    assert got["config"] | where == config.to_dict() | where
    assert got["ids"] is None
    assert got["refused"] == (tmp_path / "here" / NO_TOKENIZER).read_text().strip()
