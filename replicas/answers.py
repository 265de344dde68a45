"""What a replica answers for each kind of work, one type each (semantics 4, 14, 18, 20):
``ScoringEngine.score_batch`` returns them, ``ScoredWork`` carries them across the handle,
and the ingress checks one against its work before it reads it (``checked``), so a wrong
shape from a replica is a 500 naming what came back, never a body built from it.

The array answers are float32 arrays (``numpy.ndarray`` subclasses: everything that reads
an array reads them); a prompt's answer is a list of ``PromptLogprobs``. A work names its
answer type (``ScoreWork.answer``, ...). Answers of other shapes (per-token vectors, sparse
vectors) are further types here, with their own ``checked``.

Jax-free and rank 0: nothing of the tree is imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from replicas.errors import Reason, ScoringError


class Rows(np.ndarray):
    """float32 ``[rows, width]``: one row per item or input."""

    what = "rows"

    @classmethod
    def of(cls, value: Any) -> Any:
        """``value`` as this answer (a float32 view, or a copy of another dtype)."""
        return np.asarray(value, np.float32).view(cls)

    @classmethod
    def empty(cls, rows: int, width: int) -> Any:
        return cls.of(np.zeros((rows, width), np.float32))

    @classmethod
    def checked(cls, value: Any, rows: int, width: int) -> Any:
        """``value`` as this answer, refused (500) unless ``[rows, width]`` and finite."""
        answer = cls.of(value)
        if answer.shape != (rows, width) or not np.isfinite(answer).all():
            finite = bool(np.isfinite(answer).all())
            raise ScoringError(
                Reason.INTERNAL,
                f"replica returned {cls.what} of shape {answer.shape} (finite: {finite}), "
                f"expected {(rows, width)}",
                status_code=500,
            )
        return answer


class LabelScores(Rows):
    """A ScoreWork's answer: ``[items, labels]`` label log-probabilities (a score-head
    model's head outputs)."""

    what = "label scores"


class Vectors(Rows):
    """An EmbedWork's answer: ``[inputs, dimension]`` pooled vectors (a cross-encoder's pairs:
    its head's logits ``[pairs, labels]``)."""

    what = "vectors"


class PromptScores(list):
    """A PromptWork's answer: one ``PromptLogprobs`` per prompt."""

    @classmethod
    def of(cls, value: Iterable[Any]) -> PromptScores:
        return value if isinstance(value, cls) else cls(value)

    @classmethod
    def checked(cls, value: Iterable[Any], prompts: int) -> PromptScores:
        answer = cls.of(value)
        if len(answer) != prompts:
            message = f"replica answered {len(answer)} prompts of {prompts}"
            raise ScoringError(Reason.INTERNAL, message, status_code=500)
        return answer


Answer = LabelScores | PromptScores | Vectors  # what score_batch returns per work
