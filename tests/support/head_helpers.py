"""Tiny random score-head checkpoints (transformers ``save_pretrained``, safetensors) and
transformers' head outputs for them, the fp32 reference of tests/engine/test_heads.py.

``Qwen2ForRewardModel`` is remote code, not a transformers class: its checkpoint and reference
are transformers' ``Qwen2Model`` with the reward head (D -> D, ReLU, D -> 1) in plain PyTorch
on top, saved under the names the remote code uses (``model.*``, ``score.0.*``, ``score.2.*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.model_helpers import GEMMA2, TINY, randomize_

PAD = 0  # pad_token_id of every head config; real tokens are drawn from 1..vocab-1
# name -> (transformers config class, architecture, overrides of TINY)
HEAD_VARIANTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3-seqcls-3": (
        "Qwen3Config",
        "Qwen3ForSequenceClassification",
        {
            "head_dim": 32,
            "tie_word_embeddings": True,
            "num_labels": 3,
            "id2label": {0: "neg", 1: "neu", 2: "pos"},
            "label2id": {"neg": 0, "neu": 1, "pos": 2},
        },
    ),
    "qwen3-seqcls-1": ("Qwen3Config", "Qwen3ForSequenceClassification", {"num_labels": 1}),
    "llama-seqcls-1": ("LlamaConfig", "LlamaForSequenceClassification", {"num_labels": 1}),
    "qwen2-seqcls-2": ("Qwen2Config", "Qwen2ForSequenceClassification", {"num_labels": 2}),
    "qwen2-reward": ("Qwen2Config", "Qwen2ForRewardModel", {"num_labels": 1}),
    # A head on a windowed, soft-capped family (Skywork-Reward-Gemma-2 is one): the queries
    # of 11 tokens cross its window of 4.
    "gemma2-seqcls-1": (
        "Gemma2Config",
        "Gemma2ForSequenceClassification",
        {**GEMMA2, "num_labels": 1},
    ),
}


def head_config(variant: str, **extra: Any) -> Any:
    import transformers

    class_name, arch, overrides = HEAD_VARIANTS[variant]
    config = getattr(transformers, class_name)(
        **{**TINY, **overrides, **extra}, pad_token_id=PAD, architectures=[arch]
    )
    return config


class RewardModel:
    """``Qwen2ForRewardModel``'s forward: Qwen2Model, then the head at every position."""

    def __init__(self, config: Any) -> None:
        import torch
        from transformers import Qwen2Model

        self.module = torch.nn.Module()
        self.module.model = Qwen2Model(config)
        self.module.score = torch.nn.Sequential(
            torch.nn.Linear(config.hidden_size, config.hidden_size),
            torch.nn.ReLU(),
            torch.nn.Linear(config.hidden_size, 1),
        )
        self.config = config

    def __call__(self, **inputs: Any) -> Any:
        hidden = self.module.model(**inputs).last_hidden_state  # [B, T, D]
        return self.module.score(hidden)  # [B, T, 1]


def save_tiny_head(variant: str, directory: Path, seed: int = 0, **extra: Any) -> Path:
    """A tiny random head model of ``variant`` in ``directory`` (safetensors)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    config = head_config(variant, **extra)
    if config.architectures == ["Qwen2ForRewardModel"]:
        reward = RewardModel(config)
        randomize_(reward.module, seed)
        state = {k: v.contiguous() for k, v in reward.module.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(directory)
        return directory
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    randomize_(model, seed)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def _load_reference(directory: Path) -> Any:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(directory))
    if config.architectures == ["Qwen2ForRewardModel"]:
        reward = RewardModel(config)
        reward.module.load_state_dict(load_file(str(directory / "model.safetensors")))
        reward.module.eval()
        return reward
    return AutoModelForSequenceClassification.from_pretrained(
        str(directory), dtype=torch.float32
    ).eval()


def padded(rows: list[list[int]], left: bool) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, attention mask) [B, T] of ``rows`` padded with PAD on the left or right."""
    width = max(len(row) for row in rows)
    tokens = np.full((len(rows), width), PAD, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        tokens[i, span], mask[i, span] = row, 1
    return tokens, mask


def hf_head_outputs(directory: Path, rows: list[list[int]], left: bool) -> np.ndarray:
    """transformers' fp32 head outputs ``[B, num_labels]`` of ``rows`` in one padded batch,
    read where transformers reads them (the last non-pad token; positions count real tokens
    only, so left padding moves nothing)."""
    import torch

    model = _load_reference(directory)
    tokens, mask = padded(rows, left)
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    inputs = {
        "input_ids": torch.from_numpy(tokens),
        "attention_mask": torch.from_numpy(mask),
        "position_ids": torch.from_numpy(positions),
    }
    with torch.no_grad():
        if isinstance(model, RewardModel):
            per_token = model(**inputs)  # [B, T, 1]
            last = np.array([len(row) - 1 for row in rows]) + (
                tokens.shape[1] - np.array([len(r) for r in rows]) if left else 0
            )
            return per_token[torch.arange(len(rows)), torch.from_numpy(last)].float().numpy()
        return model(**inputs).logits.float().numpy()
