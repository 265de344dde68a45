"""Analytic model FLOPs of scoring work: the useful arithmetic, padding excluded."""

from __future__ import annotations

from collections.abc import Sequence

from replicas.model.config import ModelConfig


def matmul_params_per_token(c: ModelConfig) -> int:
    """Weights every token multiplies through (projections and MLP, all layers): a gated
    MLP's three matrices (GeGLU's doubled input one counts as two), BERT's two."""
    attn = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    attn += c.num_heads * c.head_dim * c.hidden_size
    matrices = 2 if c.encoder and not c.rotary else 3
    mlp = matrices * c.hidden_size * c.intermediate_size
    return c.num_layers * (attn + mlp)


def token_flops(c: ModelConfig, keys_attended: int) -> int:
    """One token through the stack, reading ``keys_attended`` keys in every layer."""
    attention = 4 * keys_attended * c.num_heads * c.head_dim * c.num_layers
    return 2 * matmul_params_per_token(c) + attention


def lm_head_flops(c: ModelConfig) -> int:
    return 2 * c.hidden_size * c.vocab_size


def multi_item_flops(c: ModelConfig, query_len: int, item_lens: Sequence[int]) -> int:
    """Query once, every item token reads the query plus its own item, LM head per item."""
    total = sum(token_flops(c, t + 1) for t in range(query_len))
    for length in item_lens:
        total += sum(token_flops(c, query_len + k + 1) for k in range(length))
    return total + len(item_lens) * lm_head_flops(c)


def single_item_flops(c: ModelConfig, query_len: int, item_lens: Sequence[int]) -> int:
    """Every item re-reads the query in its own row."""
    rows = [query_len + length for length in item_lens]
    return sum(sum(token_flops(c, t + 1) for t in range(row)) + lm_head_flops(c) for row in rows)
