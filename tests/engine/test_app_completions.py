"""/v1/completions and the tokenizer routes over in-process HTTP (app.http, no Ray), with the
real engine on the tiny random-weight Llama and SmolLM2's tokenizer; prompt log-probs against
transformers (PyTorch, fp32, same weights). tests/serve/test_lm_eval.py runs the same
routes on a real Ray Serve with lm-evaluation-harness as the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.http import build_api
from app.service import ScoringService
from replicas.contract import PromptWork
from tests.support.http_support import Reply, ask


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path) -> Any:
    from replicas.engine.scoring_engine import ScoringEngine
    from replicas.settings import ReplicaSettings

    settings = ReplicaSettings.from_keys(
        model=str(tiny_llama_dir),
        multi_item_scoring_delimiter=0,
        token_buckets=(16, 32, 64, 128),
        item_token_buckets=(16, 32, 64, 128),
        max_multi_item_seq_len=256,
        max_items_per_request=8,
        background_compile=False,
    )
    engine = ScoringEngine.from_settings(settings, warm=False)
    service = ScoringService.from_settings(settings)
    works: list[Any] = []

    async def backend(work: PromptWork) -> Any:
        works.append(work)
        return engine.score_batch([work])[0]

    async def health() -> None:
        return None

    api = build_api(service, backend, health)

    def post(path: str, body: Any) -> Reply:
        return ask(api, "POST", path, json.dumps(body).encode())

    post.api, post.works, post.engine = api, works, engine  # type: ignore[attr-defined]
    return post


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path) -> Any:
    """Log-softmax after every prefix of a prompt, from transformers (fp32)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> np.ndarray:  # [L, V]: row j after ids[: j + 1]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, -1).numpy()

    logprobs.tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)  # type: ignore[attr-defined]
    return logprobs


def test_echo_log_probs_equal_transformers_for_a_batch_of_mixed_prompts(
    served: Any, reference: Any
) -> None:
    context = [int(t) for t in np.random.default_rng(0).integers(100, 40000, 45)]
    prompts = [[*context, 11, 12], [*context, 13, 14, 15, 16, 17], [5], [7, 8, 9]]
    reply = served(
        "/v1/completions",
        {"prompt": prompts, "echo": True, "logprobs": 3, "max_tokens": 1, "temperature": 0},
    )
    assert reply.status == 200, reply.body
    body = reply.body
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    worst = 0.0
    for prompt, choice in zip(prompts, body["choices"], strict=True):
        ref = reference(prompt)
        got = choice["logprobs"]
        assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
        assert len(got["tokens"]) == len(prompt) + 1  # the prompt and the greedy token
        want = [ref[j - 1, prompt[j]] for j in range(1, len(prompt))] + [ref[-1].max()]
        worst = max(worst, float(np.abs(np.subtract(got["token_logprobs"][1:], want)).max()))
        for j in range(1, len(prompt) + 1):
            top = got["top_logprobs"][j]
            assert len(top) <= 3 and max(top.values()) == pytest.approx(ref[j - 1].max(), abs=1e-4)
        greedy = int(np.argmax(ref[-1]))
        assert got["tokens"][-1] == reference.tokenizer.decode([greedy])
        assert choice["finish_reason"] == "length"
        assert got["text_offset"][0] == 0
    print(f"\n[completions] worst |log-prob - transformers|: {worst:.2g}")
    assert worst <= 1e-4
    assert body["usage"] == {
        "prompt_tokens": sum(map(len, prompts)),
        "completion_tokens": 4,
        "total_tokens": sum(map(len, prompts)) + 4,
    }


def test_zero_logprobs_give_each_position_the_chosen_tokens_entry(served, reference) -> None:
    """OpenAI's and vLLM's legacy completions (vLLM's test_zero_logprobs,
    test_echo_logprob_completion[0]): with ``logprobs: 0`` each position's ``top_logprobs``
    holds the chosen token (the prompt's, then the greedy one) with its log-prob."""
    prompt = [40, 41, 42, 43, 44]
    body = {"prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 1}
    reply = served("/v1/completions", body)
    assert reply.status == 200, reply.body
    got = reply.body["choices"][0]["logprobs"]
    assert got["top_logprobs"][0] is None and len(got["top_logprobs"]) == len(prompt) + 1
    rows = zip(got["tokens"], got["token_logprobs"], got["top_logprobs"], strict=True)
    assert [top == {token: value} for token, value, top in rows][1:] == [True] * len(prompt)
    ref = reference(prompt)
    greedy = reference.tokenizer.decode([int(np.argmax(ref[-1]))])
    assert got["top_logprobs"][-1] == {greedy: pytest.approx(ref[-1].max(), abs=1e-4)}


def test_text_prompts_echo_their_text_and_match_token_prompts(served: Any, reference: Any) -> None:
    text = "The capital of France is"
    ids = reference.tokenizer(text, add_special_tokens=True)["input_ids"]
    as_text = served("/v1/completions", {"prompt": text, "echo": True, "logprobs": 1})
    as_ids = served("/v1/completions", {"prompt": ids, "echo": True, "logprobs": 1})
    assert as_text.status == as_ids.status == 200
    choice, same = as_text.body["choices"][0], as_ids.body["choices"][0]
    assert choice["text"] == text and same["text"] == reference.tokenizer.decode(ids)
    assert choice["logprobs"]["token_logprobs"] == same["logprobs"]["token_logprobs"]
    assert "".join(choice["logprobs"]["tokens"]) == text
    assert as_text.body["usage"]["completion_tokens"] == 0  # max_tokens absent: 0


def test_without_echo_only_the_greedy_token_comes_back(served: Any, reference: Any) -> None:
    prompt = [40, 41, 42, 43]
    reply = served("/v1/completions", {"prompt": prompt, "max_tokens": 1, "logprobs": 2})
    assert reply.status == 200
    choice = reply.body["choices"][0]
    greedy = int(np.argmax(reference(prompt)[-1]))
    assert choice["text"] == reference.tokenizer.decode([greedy])
    assert len(choice["logprobs"]["token_logprobs"]) == 1
    plain = served("/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert plain.body["choices"][0]["logprobs"] is None
    assert plain.body["choices"][0]["text"] == choice["text"]


@pytest.mark.parametrize(
    ("change", "reason", "param"),
    [
        ({"max_tokens": 2}, "generation_not_supported", "max_tokens"),
        ({"n": 2}, "generation_not_supported", "n"),
        ({"best_of": 3}, "generation_not_supported", "best_of"),
        ({"stream": True}, "generation_not_supported", "stream"),
        ({"suffix": "x"}, "generation_not_supported", "suffix"),
        ({"max_tokens": 1, "temperature": 0.7}, "generation_not_supported", "temperature"),
        ({"logprobs": 21}, "invalid_request", "logprobs"),
        ({"frequency_bias": 1}, "invalid_request", "frequency_bias"),
        ({"prompt": []}, "empty_prompt", "prompt"),
        ({"prompt": [[]]}, "empty_prompt", "prompt"),
        ({"prompt": ""}, "empty_prompt", "prompt"),
        ({"prompt": [[1, 2], "text"]}, "invalid_request", "prompt"),
        ({"prompt": [49152]}, "token_id_exceeds_vocab", "prompt"),
        ({"prompt": [-1]}, "negative_token_id", "prompt"),
        ({"prompt": [[1]] * 9}, "too_many_items", "prompt"),
        ({"prompt": [1] * 300}, "sequence_too_long", "prompt"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field_and_never_reach_the_replica(
    served: Any, change: dict[str, Any], reason: str, param: str
) -> None:
    before = len(served.works)
    reply = served("/v1/completions", {"prompt": [1, 2, 3], "echo": True} | change)
    assert reply.status == 400, reply.body
    assert reply.body["reason"] == reason and reply.body["param"] == param, reply.body
    assert len(served.works) == before


def test_tokenizer_routes_speak_lm_evals_remote_tokenizer(served: Any, reference: Any) -> None:
    info = ask(served.api, "GET", "/tokenizer_info")
    assert info.status == 200
    tokenizer = reference.tokenizer
    assert info.body["eos_token"] == tokenizer.eos_token
    assert info.body["bos_token"] == tokenizer.bos_token
    assert info.body["chat_template"] == tokenizer.chat_template
    text = "Multi-token answers, scored."
    tokens = served("/tokenize", {"prompt": text, "add_special_tokens": False})
    assert tokens.status == 200
    assert tokens.body["tokens"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokens.body["count"] == len(tokens.body["tokens"])
    back = served("/detokenize", {"tokens": tokens.body["tokens"]})
    assert back.status == 200 and back.body == {"prompt": text}
    assert served("/detokenize", {"tokens": [10**9]}).body["reason"] == "token_id_exceeds_vocab"
    assert served("/tokenize", {"text": "x"}).status == 400
