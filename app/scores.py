"""Log-probabilities -> the scores a client sees (semantics 5), with NumPy/SciPy.

``apply_softmax=True``: softmax over the requested labels of each row (rows sum to 1).
``apply_softmax=False``: ``exp(logprob)``, the full-vocabulary probability of each label.
A score-head model's rows are its logits instead (``head_scores``, ``classify_probs``).
Never JAX: this runs in the CPU ingress.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, softmax


def to_scores(logprobs: np.ndarray, apply_softmax: bool) -> list[list[float]]:
    """``logprobs`` is ``[n_items, n_labels]``; computed in float64, returned as lists."""
    values = np.asarray(logprobs, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"expected [items, labels] log-probabilities, got shape {values.shape}")
    if values.shape[0] == 0:
        return []
    probabilities = softmax(values, axis=1) if apply_softmax else np.exp(values)
    return probabilities.tolist()


def head_scores(outputs: np.ndarray, apply_softmax: bool) -> list[list[float]]:
    """A score head's ``[n_items, num_labels]`` logits -> /v1/score rows (semantics 18):
    ``apply_softmax`` softmax over the labels, or the sigmoid of a single label (never a
    constant 1.0); else the raw logits."""
    values = np.asarray(outputs, dtype=np.float64)
    if values.shape[0] == 0:
        return []
    if not apply_softmax:
        return values.tolist()
    if values.shape[1] == 1:
        return expit(values).tolist()
    return softmax(values, axis=1).tolist()


def classify_probs(outputs: np.ndarray, problem_type: str | None) -> np.ndarray:
    """/v1/classify's activation of ``[n, num_labels]`` logits from the config's
    ``problem_type``: multi-label -> sigmoid per label, regression -> identity, else softmax
    (sigmoid for a single label). float64."""
    values = np.asarray(outputs, dtype=np.float64)
    if problem_type == "regression":
        return values
    if problem_type == "multi_label_classification" or values.shape[1] == 1:
        return expit(values)
    return softmax(values, axis=1)
