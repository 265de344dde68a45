"""lm-evaluation-harness's own ``local-completions`` model against scorejax on a real Ray
Serve, with its remote tokenizer (the server's /tokenize, /detokenize, /tokenizer_info), on a
small multiple-choice task of our own (tests/data/scorejax_mc), fully offline.

Model: the tiny random-weight Llama with SmolLM2's tokenizer. Every choice's log-likelihood
lm-eval reports equals a direct transformers computation (PyTorch, fp32, same weights,
tokenized as lm-eval tokenizes), its accuracy is the one those log-likelihoods give, and the
choices' shared context was computed once (the server's prefix-reuse counters).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.builder import scoring_app
from replicas.settings import ReplicaSettings
from tests.support.serve_support import RAY_SERVE, ServeCluster, serve_cluster  # noqa: F401

pytestmark = [pytest.mark.slow, RAY_SERVE]

TASK_DIR = Path(__file__).parents[1] / "data" / "scorejax_mc"
PREFIX = "/lmeval"


@pytest.fixture(scope="module")
def served(serve_cluster: ServeCluster, tiny_llama_dir: Path) -> Iterator[str]:  # noqa: F811
    settings = ReplicaSettings.from_keys(
        model=str(tiny_llama_dir),
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 32, 64, 128),
        item_token_buckets=(16, 32, 64, 128),
        batch_buckets=(1, 2, 4),
        max_items_per_request=16,
        max_multi_item_seq_len=256,
        max_batch_size=4,
        max_queue_wait_s=0,
    )
    app = scoring_app(
        settings,
        replica_options={"ray_actor_options": {"num_cpus": 0.25}},
        ingress_options={"ray_actor_options": {"num_cpus": 0.1}},
    )
    serve_cluster.deploy_many([(app, "lmeval", PREFIX)])
    yield serve_cluster.http_url + PREFIX


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task's YAML with the questions' absolute path (lm-eval reads ``data_files`` as
    given; nothing is fetched)."""
    directory = tmp_path_factory.mktemp("tasks")
    text = (TASK_DIR / "scorejax_mc.yaml").read_text()
    data = str((TASK_DIR / "questions.jsonl").resolve())
    (directory / "scorejax_mc.yaml").write_text(text.replace("DATA_FILE", data))
    return directory


@pytest.fixture(scope="module")
def evaluated(served: str, task_dir: Path) -> dict[str, Any]:
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # the json loader reads the local file only
    import lm_eval
    from lm_eval.tasks import TaskManager

    name = httpx.get(f"{served}/v1/models", timeout=30).json()["data"][0]["id"]
    model_args = {
        "base_url": f"{served}/v1/completions",
        "model": name,
        "tokenizer_backend": "remote",
        "num_concurrent": 1,
        "max_retries": 1,
        "batch_size": 8,
    }
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=model_args,
        tasks=["scorejax_mc"],
        task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    assert results is not None
    return results


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path) -> Any:
    """A continuation's log-likelihood by transformers, tokenized as lm-eval does it: the
    context's trailing spaces move to the continuation, the two are encoded whole (no special
    tokens), and the continuation is what follows the context's own tokens."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)

    def loglikelihood(context: str, continuation: str) -> float:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
        start = len(tokenizer(context, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logits = model(torch.tensor([whole])).logits[0].double()
        logprobs = torch.log_softmax(logits, -1)
        return float(sum(logprobs[j - 1, whole[j]] for j in range(start, len(whole))))

    return loglikelihood


def test_lm_eval_log_likelihoods_and_accuracy_equal_transformers(
    evaluated: dict[str, Any], reference: Any
) -> None:
    samples = evaluated["samples"]["scorejax_mc"]
    assert len(samples) == 12
    worst, correct = 0.0, []
    for sample in samples:
        served = [float(resp[0]) for resp in sample["filtered_resps"]]
        direct = [reference(*args) for args in sample["arguments"]]
        assert len(served) == len(direct) == 4
        worst = max(worst, float(np.abs(np.subtract(served, direct)).max()))
        correct.append(int(np.argmax(direct)) == sample["target"])
    print(f"\n[lm-eval] worst |log-likelihood - transformers| over 48 choices: {worst:.2g}")
    assert worst <= 1e-3
    accuracy = evaluated["results"]["scorejax_mc"]["acc,none"]
    assert accuracy == pytest.approx(float(np.mean(correct)), abs=1e-12)


def test_the_choices_shared_context_is_reused(served: str, evaluated: dict[str, Any]) -> None:
    stats = httpx.get(f"{served}/v1/stats", timeout=30).json()
    prompts = sum(
        len(args[0])
        for sample in evaluated["samples"]["scorejax_mc"]
        for args in sample["arguments"]
    )
    assert prompts > 0
    print(
        f"\n[lm-eval] prompt tokens {stats['prompt_tokens']}, reused "
        f"{stats['reused_prefix_tokens']}, computed {stats['computed_prompt_tokens']}"
    )
    # Every context starts with the task's description (three whole blocks and more).
    assert stats["reused_prefix_tokens"] >= 0.4 * stats["prompt_tokens"]
    assert stats["prompt_tokens"] == stats["reused_prefix_tokens"] + stats["computed_prompt_tokens"]


def test_the_handle_answers_completions_as_http_does(served: str) -> None:
    from ray import serve

    prompt = [[40, 41, 42, 43, 44], [40, 41, 42, 7]]
    fields = {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 1}
    over_http = httpx.post(f"{served}/v1/completions", json=fields, timeout=60).json()
    handle = serve.get_app_handle("lmeval")
    through_handle = handle.completions.remote(**fields).result(timeout_s=60)
    assert through_handle["choices"] == over_http["choices"]
    assert (
        through_handle["usage"]
        == over_http["usage"]
        == {
            "prompt_tokens": 9,
            "completion_tokens": 2,
            "total_tokens": 11,
        }
    )
