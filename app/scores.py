"""Log-probabilities -> the scores a client sees (DESIGN.md semantics 5), with NumPy/SciPy.

``apply_softmax=True``: softmax over the requested labels of each row (rows sum to 1).
``apply_softmax=False``: ``exp(logprob)``, the full-vocabulary probability of each label.
Never JAX: this runs in the CPU ingress.
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax


def to_scores(logprobs: np.ndarray, apply_softmax: bool) -> list[list[float]]:
    """``logprobs`` is ``[n_items, n_labels]``; computed in float64, returned as lists."""
    values = np.asarray(logprobs, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"expected [items, labels] log-probabilities, got shape {values.shape}")
    if values.shape[0] == 0:
        return []
    probabilities = softmax(values, axis=1) if apply_softmax else np.exp(values)
    return probabilities.tolist()
