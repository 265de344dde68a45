"""Every engine keeps the whole engine contract (replicas/engine_contract.py): the replica
calls each member directly, so an engine that lacks one, or takes other arguments, fails here
rather than on a replica. The jax engines are checked as classes (nothing is constructed);
the fake is also constructed as the tests construct it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pickle
import typing
from pathlib import Path

import pytest

from replicas.engine_contract import Engine, EngineStats
from replicas.errors import Reason, ScoringError
from replicas.settings import ReplicaSettings
from tests.support.fake_engine import FakeEngine, SlowFakeEngine, WorkFakeEngine

IMPLEMENTATIONS = (
    "replicas.engine.scoring_engine:ScoringEngine",
    "replicas.engine.group_engine:GroupEngine",
    "replicas.engine.slice_engine:SliceEngine",
    "tests.support.fake_engine:FakeEngine",
    "tests.support.fake_engine:SlowFakeEngine",
    "tests.support.fake_engine:WorkFakeEngine",
    "tests.unit.test_serve_replica:PickyEngine",
    "tests.unit.test_serve_replica:GatedEngine",
    "tests.unit.test_serve_replica:CompilingEngine",
    "tests.unit.test_serve_replica:BrokenEngine",
)


MEMBERS = (
    "info",
    "compile_count",
    "score_batch",
    "stats",
    "check_health",
    "load_adapter",
    "unload_adapter",
)
CONTRACT = {name: inspect.getattr_static(Engine, name) for name in MEMBERS}


def members(cls: type) -> dict[str, object]:
    """The contract's members as ``cls`` (or a base) declares them."""
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if name in CONTRACT}


def test_the_contract_is_what_the_replica_uses() -> None:
    declared = {name for name in vars(Engine) if not name.startswith("_")}
    assert declared == set(CONTRACT)
    for name, member in CONTRACT.items():
        doc = member.fget.__doc__ if isinstance(member, property) else member.__doc__
        assert doc and doc.strip(), f"Engine.{name} has no docstring"


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _parameters(function: object) -> list[tuple[str, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind) for p in signature.parameters.values()]


@pytest.mark.parametrize("path", IMPLEMENTATIONS)
def test_each_engine_implements_every_member(path: str) -> None:
    cls = _load(path)
    found = members(cls)
    assert set(found) == set(CONTRACT), f"{path} lacks {sorted(set(CONTRACT) - set(found))}"
    for name, wanted in CONTRACT.items():
        got = found[name]
        if isinstance(wanted, property):
            assert isinstance(got, property), f"{path}.{name} must be a property"
            continue
        assert inspect.isfunction(got), f"{path}.{name} must be a plain method"
        # The replica calls positionally with the contract's arguments: same names and kinds
        # (extra parameters only with defaults).
        required = [
            (p.name, p.kind)
            for p in inspect.signature(got).parameters.values()
            if p.default is inspect.Parameter.empty
        ]
        assert required == _parameters(wanted), f"{path}.{name}{inspect.signature(got)}"


@pytest.fixture
def settings(tiny_llama_dir: Path) -> ReplicaSettings:
    return ReplicaSettings.from_keys(model=str(tiny_llama_dir), multi_item_scoring_delimiter=0)


@pytest.mark.parametrize("cls", [FakeEngine, SlowFakeEngine, WorkFakeEngine])
def test_the_fake_engine_as_tests_build_it_is_an_engine(
    cls: type[FakeEngine], settings: ReplicaSettings
) -> None:
    engine = cls.from_settings(settings)
    assert isinstance(engine, Engine)
    engine.check_health()
    assert engine.stats() == EngineStats.zero()  # counts nothing
    for change in (lambda: engine.load_adapter("a", "/x"), lambda: engine.unload_adapter("a")):
        with pytest.raises(ScoringError) as refused:  # no slots: the load route's 400
            change()
        assert refused.value.reason == Reason.INVALID_REQUEST
        assert refused.value.status_code == 400


def test_an_object_missing_a_member_is_no_engine(settings: ReplicaSettings) -> None:
    class Partial:  # the replica's old, stale Protocol
        info = FakeEngine.from_settings(settings).info
        compile_count = 0

        def score_batch(self, works: object) -> list[object]:
            return []

    assert not isinstance(Partial(), Engine)


# GET /v1/stats's engine keys, in order, as the engines answered them as dicts (before 81).
STATS_KEYS = (
    "compile_count", "warmup_compiles", "request_path_compiles", "background_compiles",
    "evicted_signatures", "declined_background_compiles", "declined_one_off",
    "declined_small_padding", "declined_low_value", "evicted_one_off", "evicted_low_value",
    "background_pending", "steps", "computed_tokens", "useful_tokens", "prompt_tokens",
    "reused_prefix_tokens", "computed_prompt_tokens", "engine_seconds", "query_cache_hits",
    "query_cache_misses", "query_cache_entries", "query_cache_bytes",
    "query_cache_capacity_bytes",
)  # fmt: skip
HOST_GROUP_KEYS = ("hosts", "host_members", "host_compile_counts", "tpu_slice")


@pytest.mark.parametrize("path", IMPLEMENTATIONS)
def test_every_engine_answers_stats_as_engine_stats(path: str) -> None:
    stats = typing.get_type_hints(_load(path).stats)["return"]
    assert stats is EngineStats, f"{path}.stats() -> {stats}"


def test_engine_stats_answer_the_keys_of_v1_stats_as_they_were() -> None:
    one_host = EngineStats.zero()
    assert tuple(one_host.as_dict()) == STATS_KEYS
    assert all(type(v) is int for k, v in one_host.as_dict().items() if k != "engine_seconds")
    group = dataclasses.replace(
        one_host,
        hosts=2,
        host_members=({"process": 0, "node": "10.0.0.1", "pid": 7},) * 2,
        host_compile_counts=(3, 3),
        tpu_slice=("slice-a", "slice-a"),
    )
    answered = group.as_dict()
    assert tuple(answered) == STATS_KEYS + HOST_GROUP_KEYS
    assert answered["host_compile_counts"] == [3, 3] and answered["tpu_slice"] == ["slice-a"] * 2
    assert pickle.loads(pickle.dumps(group)) == group  # a slice's leader sends it across Ray
    with pytest.raises(dataclasses.FrozenInstanceError):
        group.steps = 1  # type: ignore[misc]


def test_a_counter_without_a_field_fails_loudly() -> None:
    with pytest.raises(TypeError):
        EngineStats(**EngineStats.zero().as_dict() | {"declined_new_reason": 1})
    with pytest.raises(AttributeError):
        _ = EngineStats.zero().query_cache_hit  # type: ignore[attr-defined]
