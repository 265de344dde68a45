"""What a replica answers for each kind of work, one type each (semantics 4, 14, 18, 20):
``ScoringEngine.score_batch`` returns them, ``ScoredWork`` carries them across the handle,
and the ingress checks one against its work before it reads it (``checked``), so a wrong
shape from a replica is a 500 naming what came back, never a body built from it.

The array answers are float32 arrays (``numpy.ndarray`` subclasses: everything that reads
an array reads them); a prompt's answer is a list of ``PromptLogprobs``. A work names its
answer type (``ScoreWork.answer``, ...; an EmbedWork's by its ``output``): a
late-interaction model's per-token vectors are ``TokenVectors``, a sparse model's
``SparseVectors``, each with its own ``checked``.

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


def _refused(message: str) -> ScoringError:
    return ScoringError(Reason.INTERNAL, f"replica returned {message}", status_code=500)


class TokenVectors(list):
    """An EmbedWork's answer for ``output`` ``tokens``: per input, float32 ``[tokens,
    dimension]``, one vector per token of the input in order."""

    @classmethod
    def of(cls, value: Iterable[Any]) -> TokenVectors:
        if isinstance(value, cls):
            return value
        return cls(np.asarray(vectors, np.float32) for vectors in value)

    @classmethod
    def empty(cls, inputs: int, dimension: int) -> TokenVectors:
        return cls(np.zeros((0, dimension), np.float32) for _ in range(inputs))

    @classmethod
    def checked(cls, value: Any, lengths: Iterable[int], dimension: int) -> TokenVectors:
        """Refused (500) unless one finite ``[length, dimension]`` array per input."""
        answer, lengths = cls.of(value), list(lengths)
        shapes = [vectors.shape for vectors in answer]
        if shapes != [(n, dimension) for n in lengths]:
            expected = f"{lengths[:4]} x {dimension}"
            raise _refused(f"token vectors of shapes {shapes[:4]}, expected {expected}")
        if not all(np.isfinite(vectors).all() for vectors in answer):
            raise _refused("token vectors that are not finite")
        return answer


class SparseVectors(list):
    """An EmbedWork's answer for ``output`` ``sparse``: per input, ``(indices int32 [k],
    values float32 [k])``, its non-zero weights by ascending vocabulary index."""

    @classmethod
    def of(cls, value: Iterable[Any]) -> SparseVectors:
        if isinstance(value, cls):
            return value
        return cls(
            (np.asarray(indices, np.int32), np.asarray(values, np.float32))
            for indices, values in value
        )

    @classmethod
    def empty(cls, inputs: int, dimension: int) -> SparseVectors:
        return cls((np.zeros(0, np.int32), np.zeros(0, np.float32)) for _ in range(inputs))

    @classmethod
    def checked(cls, value: Any, inputs: int, dimension: int) -> SparseVectors:
        """Refused (500) unless ``inputs`` pairs of matching length, indices ascending in
        ``[0, dimension)``, values finite."""
        answer = cls.of(value)
        if len(answer) != inputs:
            raise _refused(f"{len(answer)} sparse vectors for {inputs} inputs")
        for indices, values in answer:
            ordered = indices.shape == values.shape and bool(np.all(np.diff(indices) > 0))
            inside = not indices.size or (indices[0] >= 0 and indices[-1] < dimension)
            if not (ordered and inside and np.isfinite(values).all()):
                raise _refused(f"a sparse vector of {indices.size} weights out of order or range")
        return answer


class HybridVectors(list):
    """An EmbedWork's answer for ``output`` ``hybrid`` (BGE-M3): per input ``(dense [D],
    multi-vector [tokens - 1, C], lexical weights [tokens])``, float32: its dense vector, a
    vector per token after the first, a weight per token (the ingress folds those by token
    id)."""

    @classmethod
    def of(cls, value: Iterable[Any]) -> HybridVectors:
        if isinstance(value, cls):
            return value
        return cls(tuple(np.asarray(part, np.float32) for part in parts) for parts in value)

    @classmethod
    def empty(cls, inputs: int, dimension: int) -> HybridVectors:
        nothing = np.zeros(0, np.float32)
        return cls(
            (np.zeros(dimension, np.float32), nothing[:, None], nothing) for _ in range(inputs)
        )

    @classmethod
    def checked(
        cls, value: Any, lengths: Iterable[int], dimension: int, colbert: int
    ) -> HybridVectors:
        """Refused (500) unless each input's three parts have its shapes and are finite."""
        answer, lengths = cls.of(value), list(lengths)
        shapes = [tuple(part.shape for part in parts) for parts in answer]
        expected = [((dimension,), (n - 1, colbert), (n,)) for n in lengths]
        if shapes != expected:
            raise _refused(f"hybrid vectors of shapes {shapes[:2]}, expected {expected[:2]}")
        if not all(np.isfinite(part).all() for parts in answer for part in parts):
            raise _refused("hybrid vectors that are not finite")
        return answer


# what score_batch returns per work
Answer = LabelScores | PromptScores | Vectors | TokenVectors | SparseVectors | HybridVectors


def answered(work: Any, value: Any) -> Any:
    """``value`` as ``work``'s answer: its class's ``answer``, or what its ``answered`` says
    (an EmbedWork's, by its ``output``)."""
    answer_of = getattr(work, "answered", None)
    return answer_of(value) if answer_of is not None else type(work).answer.of(value)
