"""Every layout keeps the layout contract (replicas/engine/layouts/contract.py): the engine
routes works and compiles steps through ``Layout`` alone, so a layout that lacks a member,
takes other arguments or declares a kind's signature differently from another layout running
that kind fails here. Classes are checked as classes; routing with layouts built on a stub
runner (nothing is compiled or scored)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from types import SimpleNamespace

import pytest

from replicas.contract import PromptWork, ScoreWork
from replicas.embed_contract import EmbedWork
from replicas.engine.layouts.common import BucketDims
from replicas.engine.layouts.contract import Layout
from replicas.engine.layouts.packed_reference import PackedReferenceLayout
from replicas.engine.layouts.prompts import PromptLayout
from replicas.engine.layouts.shared_prefix import SharedPrefixLayout
from replicas.engine.layouts.single_item import SingleItemLayout
from replicas.settings import ReplicaSettings

LAYOUTS = (
    "replicas.engine.layouts.shared_prefix:SharedPrefixLayout",
    "replicas.engine.layouts.fused:FusedLayout",
    "replicas.engine.layouts.single_item:SingleItemLayout",
    "replicas.engine.layouts.packed_reference:PackedReferenceLayout",
    "replicas.engine.layouts.prompts:PromptLayout",
    "replicas.engine.layouts.embed:EmbedLayout",
)
METHODS = ("select", "plan", "compile", "score")


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _positional(function: object) -> int:
    """Parameters the engine passes (positionally; the layout may name them its own way)."""
    parameters = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
    return sum(1 for p in parameters if p.default is inspect.Parameter.empty)


def test_the_contract_declares_what_the_engine_uses() -> None:
    declared = {name for name in vars(Layout) if not name.startswith("_")}
    assert declared == set(METHODS)
    assert "kinds" in Layout.__annotations__
    for name in METHODS:
        assert getattr(Layout, name).__doc__, f"Layout.{name} has no docstring"


@pytest.mark.parametrize("path", LAYOUTS)
def test_each_layout_implements_every_member(path: str) -> None:
    cls = _load(path)
    for name in METHODS:
        method = inspect.getattr_static(cls, name, None)
        assert inspect.isfunction(method), f"{path}.{name} must be a plain method"
        wanted = _positional(getattr(Layout, name))
        assert _positional(method) == wanted, f"{path}.{name}{inspect.signature(method)}"
    assert cls.kinds, f"{path} runs no step kind"
    for kind, dims in cls.kinds.items():
        assert isinstance(kind, str) and issubclass(dims, BucketDims), (path, kind)
        assert dataclasses.is_dataclass(dims) and dims.__dataclass_params__.frozen, (path, kind)


def test_layouts_that_share_a_kind_declare_one_signature_for_it() -> None:
    declared: dict[str, type] = {}
    for path in LAYOUTS:
        for kind, dims in _load(path).kinds.items():
            assert declared.setdefault(kind, dims) is dims, f"{path}: {kind}"
    # one prefix step and one item-stream step, whoever runs them
    assert declared["prefix"] is PromptLayout.kinds["prefix"]
    assert declared["items"] is PromptLayout.kinds["items"]


def _runner(**settings: object) -> SimpleNamespace:
    values = ReplicaSettings.from_keys(model="stub", **settings)
    return SimpleNamespace(settings=values, placement=SimpleNamespace(groups=1), cache=None)


def test_each_layout_selects_its_own_works_and_together_they_cover_a_batch() -> None:
    runner = _runner(multi_item_scoring_delimiter=0)
    model = SimpleNamespace()
    works = [
        ScoreWork((1, 2), ((3,), (4,)), (5,)),
        ScoreWork((1, 2), ((3,),), (5,), item_first=True),
        PromptWork(((1, 2, 3),), 1),
        ScoreWork((1,), (), (5,)),  # no items: nothing to run
        EmbedWork(((1, 2),)),
    ]
    assert SharedPrefixLayout(model, runner).select(works) == [0]  # type: ignore[arg-type]
    assert PackedReferenceLayout(model, runner).select(works) == [0]  # type: ignore[arg-type]
    assert SingleItemLayout(model, runner).select(works) == [(1, 0)]  # type: ignore[arg-type]
    assert PromptLayout(model, runner).select(works) == [2]  # type: ignore[arg-type]
    single = _runner()  # no delimiter: every ScoreWork item is a single-item row
    assert SingleItemLayout(model, single).select(works) == [(0, 0), (0, 1), (1, 0)]  # type: ignore[arg-type]
    assert SharedPrefixLayout(model, single).select(works) == []  # type: ignore[arg-type]
