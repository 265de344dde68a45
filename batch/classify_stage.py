"""``python -m batch classify``: each row's /v1/classify answer on a score-head model
(semantics 18) on a score-head model or a cross-encoder: ``label`` (the head's best label)
and ``probs`` (the config's activation of the head outputs; ``--no-activation``: the raw
outputs). A cross-encoder scores each text alone (``CrossEncoder.predict(text)``).

``ClassifyPrepare`` (CPU): the row's text prepared by the route's own ``prepare_classify``
(one input: its tokens as a query with one empty item), or the route's 400. The engine stage
scores every row's work in one call (the replica packs them into its steps) and
``ClassifyResults`` (``classify_results``: the model's head, or a SettingsError when it has
none) reads each row's answer as ``classify_body`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from app.classify import ClassifyWork, prepare_classify
from app.cross_encoder import Texts, activated, prepare_texts
from app.scores import classify_probs
from batch.rows import plain
from batch.works import PrepareWorks, Work
from replicas.contract import EmbedWork, ScoreHead, ScoreWork
from replicas.errors import Reason, ScoringError
from replicas.kinds import recognize
from replicas.settings import ReplicaSettings, SettingsError


@dataclass(frozen=True)
class ClassifyColumns:
    input: str = "input"
    id: str = "id"
    activation: bool = True


class ClassifyPrepare(PrepareWorks):
    """The route's tokenizer and model card per CPU actor."""

    def prepare(self, row: dict[str, Any]) -> ClassifyWork | ScoringError:
        text = plain(row.get(self._columns.input))
        if not isinstance(text, str):
            message = "input: one text per row"
            return ScoringError(Reason.INVALID_REQUEST, message, "input")
        service = self._service
        payload = {"input": text, "activation": self._columns.activation}
        try:
            if service.info.model_kind.pairs:  # the text alone, as predict(text)
                return prepare_texts(service.tokenizer, service.info, payload)
            return prepare_classify(payload, service.info, service.tokenizer)
        except ScoringError as error:
            return error

    def work_of(self, prepared: ClassifyWork | Texts) -> ScoreWork | EmbedWork:
        if isinstance(prepared, Texts):
            return prepared.work
        (work,) = prepared.works  # one text: one work
        return work


@dataclass(frozen=True)
class ClassifyResults:
    """The mode's result columns (a picklable callable: the head and the activation)."""

    head: ScoreHead
    activation: bool = True

    def __call__(
        self, batch: pa.Table, works: list[Work | None], answers: list[Any]
    ) -> dict[str, pa.Array]:
        probs: list[list[float] | None] = []
        for answer in answers:
            if answer is None:
                probs.append(None)
                continue
            outputs = np.asarray(answer, np.float64).reshape(1, -1)  # [1, num_labels]
            probs.append(np.asarray(self._activated(outputs), np.float64)[0].tolist())
        labels = [None if p is None else self.head.id2label[int(np.argmax(p))] for p in probs]
        return {
            "label": pa.array(labels, pa.string()),
            "probs": pa.array(probs, pa.list_(pa.float64())),
        }

    def _activated(self, outputs: np.ndarray) -> np.ndarray:
        """As the route: a one-label cross-encoder through its activation (float32, as
        ``CrossEncoder.predict``), other heads ``classify_probs``; raw without activation."""
        if not self.activation:
            return outputs
        if recognize(self.head, None).pairs and self.head.num_labels == 1:
            return activated(outputs, self.head.activation)
        return classify_probs(outputs, self.head.problem_type)


def model_head(settings: ReplicaSettings) -> ScoreHead | None:
    """The configured model's score head (a cross-encoder's with the activation its
    sentence-transformers directory saved), from its configs alone (no weights read)."""
    from replicas.checkpoints.sources import load_hf_config, resolve_model_source
    from replicas.model.head_config import score_head_from_hf, with_saved_activation

    source = resolve_model_source(settings.model.name)
    head = score_head_from_hf(load_hf_config(source))
    return head if source.is_gguf else with_saved_activation(head, source.directory)


def classify_results(settings: ReplicaSettings, columns: ClassifyColumns) -> ClassifyResults:
    """The results of ``columns`` on the configured model's score head; a SettingsError when
    it has none (before the job reads a row)."""
    head = model_head(settings)
    if head is None:
        raise SettingsError(
            f"model: {settings.model.name} has no score head; classify needs a sequence-"
            "classification or reward model"
        )
    return ClassifyResults(head, columns.activation)
