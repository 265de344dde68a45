"""Every model class keeps the model protocol (replicas/model/protocol.py): the engine and
its layouts use a model only through ``ScoringModel`` (the decoder layouts through
``DecoderModel``), so a class that lacks a member or takes other arguments fails here rather
than in a compile, and an engine or layout that reads a model attribute outside the protocol
fails here too (an AST read of their files: ``model.<attr>``, ``self._model.<attr>``,
``dataclasses.replace(model, <attr>=...)``). Classes are checked as classes."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from replicas.model.causal_lm import CausalLM
from replicas.model.embedding_gemma import EmbeddingGemma
from replicas.model.encoder import Encoder
from replicas.model.protocol import DecoderModel, ScoringModel

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "replicas" / "engine"
# Each model class, the protocol it keeps, and whether its layers are decoder layers.
MODELS = ((CausalLM, DecoderModel, True), (EmbeddingGemma, DecoderModel, True),
          (Encoder, ScoringModel, False))  # fmt: skip
# Files whose model is any ScoringModel (an encoder's too); the other layouts' a decoder's,
# and the engine's (it sets a decoder's ``token_split``, under ``model.decoder``).
SCORING_FILES = ("lora_slots.py", "signature_record.py", "embed.py")
# Set on a model by ``attention.with_attention`` (the engine calls it), read by no layout.
SET_BY_WITH_ATTENTION = {"stream_attention", "dense_attention"}


def protocol_members(protocol: type) -> dict[str, object]:
    """Name -> the protocol's function, or None for a field (annotated name), bases included."""
    found: dict[str, object] = {}
    for base in reversed(protocol.__mro__):
        if base not in (ScoringModel, DecoderModel):
            continue
        found |= dict.fromkeys(inspect.get_annotations(base))
        found |= {
            n: v for n, v in vars(base).items() if inspect.isfunction(v) and not n.startswith("_")
        }
    return found


def test_the_protocols_members_are_documented() -> None:
    assert set(protocol_members(ScoringModel)) < set(protocol_members(DecoderModel))
    for protocol in (ScoringModel, DecoderModel):
        for name, member in protocol_members(protocol).items():
            assert member is None or (member.__doc__ or "").strip(), f"{name} has no docstring"


@pytest.mark.parametrize(("cls", "protocol", "decoder"), MODELS)
def test_each_model_class_has_every_member(cls: type, protocol: type, decoder: bool) -> None:
    fields = {f.name for f in dataclasses.fields(cls)}
    assert cls.decoder is decoder  # type: ignore[attr-defined]
    for name, wanted in protocol_members(protocol).items():
        assert name in fields or hasattr(cls, name), f"{cls.__name__} lacks {name}"
        if wanted is None:
            continue
        got = inspect.getattr_static(cls, name)
        assert inspect.isfunction(got), f"{cls.__name__}.{name} must be a plain method"
        # The layouts call with the protocol's arguments: the same names and kinds, any
        # extra parameter with a default.
        have = inspect.signature(got).parameters
        declared = inspect.signature(wanted).parameters  # type: ignore[arg-type]
        for p in declared.values():
            assert p.name in have and have[p.name].kind == p.kind, f"{cls.__name__}.{name}"
            assert (have[p.name].default is p.empty) == (p.default is p.empty), p.name
        extra = [p for n, p in have.items() if n not in declared]
        assert all(p.default is not p.empty for p in extra), f"{cls.__name__}.{name}{extra}"


def _is_model(node: ast.expr) -> bool:
    """``model`` or ``self._model``."""
    if isinstance(node, ast.Name):
        return node.id == "model"
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "_model"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def used_members(path: Path) -> set[str]:
    """What ``path`` reads of (or replaces on) a model."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and _is_model(node.value):
            used.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "replace"
            and node.args
            and _is_model(node.args[0])
        ):
            used |= {keyword.arg for keyword in node.keywords if keyword.arg}
    return used


def _files() -> list[Path]:
    return sorted([*ENGINE.glob("*.py"), *(ENGINE / "layouts").glob("*.py")])


@pytest.mark.parametrize("path", _files(), ids=lambda path: path.name)
def test_the_engine_and_layouts_use_no_model_attribute_outside_the_protocol(path: Path) -> None:
    protocol = ScoringModel if path.name in SCORING_FILES else DecoderModel
    outside = used_members(path) - set(protocol_members(protocol))
    assert not outside, f"{path.relative_to(ROOT)} reads {sorted(outside)} of its model"


def test_the_protocol_holds_only_what_the_engine_and_layouts_use() -> None:
    used = set().union(*map(used_members, _files()))
    assert used >= {"config", "decoder", "stream_hidden", "label_logprobs", "token_split"}
    unused = set(protocol_members(DecoderModel)) - used - SET_BY_WITH_ATTENTION
    assert not unused, f"the protocol names {sorted(unused)}, which nothing reads"
