"""Loading LoRA adapters: a seq-cls fine-tune's saved ``score`` head (``modules_to_save``)
serves beside an adapter without one and the base, each equal to transformers + peft; an
adapter that does not fit the base is refused naming it (shapes, target modules, pickles,
rank, unsupported PEFT options), and the settings that cannot hold the adapters fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cluster.mesh import build_mesh
from replicas.checkpoints.adapters import AdapterError, load_adapter
from replicas.checkpoints.loading import load_model
from replicas.contract import ScoreWork
from replicas.engine.scoring_engine import ScoringEngine
from replicas.settings import ReplicaSettings, SettingsError
from tests.support.head_helpers import save_tiny_head
from tests.support.lora_helpers import lora_settings, peft_model, reference_head, save_adapter
from tests.support.model_helpers import save_tiny

TO_PEFT = 1e-4
SETTINGS = lora_settings(max_loras=2, max_lora_rank=4)


@pytest.fixture(scope="module")
def seq_cls(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny Qwen3ForSequenceClassification (3 labels), an adapter that saves its score
    head and one that does not (LoRA on v only)."""
    root = tmp_path_factory.mktemp("lora-seqcls")
    base = root / "base"
    base.mkdir()
    save_tiny_head("qwen3-seqcls-3", base)
    head = save_adapter(
        base, root / "head", seed=5, r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"],
        seq_cls=True,
    )  # fmt: skip
    bare = save_adapter(
        base, root / "bare", seed=6, r=2, lora_alpha=2, target_modules=["v_proj"], seq_cls=True,
        modules_to_save=[],
    )  # fmt: skip
    return {"base": base, "head": head, "bare": bare}


def test_saved_score_head_serves_beside_a_bare_adapter_and_the_base(seq_cls):
    weights = json.loads((seq_cls["head"] / "adapter_config.json").read_text())
    assert "score" in weights["modules_to_save"]
    adapters = (("head", str(seq_cls["head"])), ("bare", str(seq_cls["bare"])))
    settings = ReplicaSettings.from_keys(
        **SETTINGS, model=str(seq_cls["base"]), lora_adapters=adapters
    )
    engine = ScoringEngine.from_settings(settings, warm=False)
    rng = np.random.default_rng(8)
    query = tuple(int(t) for t in rng.integers(1, 256, 9))
    items = tuple(tuple(int(t) for t in rng.integers(1, 256, n)) for n in (3, 0, 6))
    names = ["head", "bare", None]
    works = [ScoreWork(query, items, (0, 1, 2), adapter=name) for name in names]
    outputs = engine.score_batch(works)
    rows = [list(query + item) for item in items]
    base_reference = reference_head(peft_model(seq_cls["base"], None, seq_cls=True), rows)
    for name, out in zip(names, outputs, strict=True):
        path = None if name is None else seq_cls[name]
        reference = reference_head(peft_model(seq_cls["base"], path, seq_cls=True), rows)
        assert out.shape == (3, 3)
        assert np.abs(out - reference).max() <= TO_PEFT, name
    assert np.abs(outputs[0] - base_reference).max() > 0.1  # the saved head is used


@pytest.fixture(scope="module")
def qwen3_config(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("lora-refused")
    base = save_tiny("qwen3", root / "base")
    return root, base, load_model(base, build_mesh((1, 1))).config


def _edited(source: Path, target: Path, **changes) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "adapter_config.json").read_text())
    (target / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return target


def test_mismatched_adapters_are_refused_naming_them(qwen3_config):
    root, base, config = qwen3_config
    llama = save_tiny("llama-kv3", root / "llama")  # hidden 48: other shapes
    other = save_adapter(
        llama, root / "other", seed=1, r=2, lora_alpha=2, target_modules=["q_proj"]
    )
    good = save_adapter(base, root / "good", seed=2, r=4, lora_alpha=4, target_modules=["v_proj"])
    assert load_adapter("good", str(good), config, max_rank=4).targets == ("v",)
    cases = {
        "other": (other, "an adapter of another base model"),
        "fc": (_edited(good, root / "fc", target_modules=["fc1", "v_proj"]), "fc1"),
        "dora": (_edited(good, root / "dora", use_dora=True), "use_dora"),
        "prefix": (_edited(good, root / "prefix", peft_type="PREFIX_TUNING"), "peft_type"),
        "rank": (good, "exceeds max_lora_rank 2"),
    }
    for name, (path, why) in cases.items():
        with pytest.raises(AdapterError) as refused:
            load_adapter(name, str(path), config, max_rank=2 if name == "rank" else 4)
        assert str(refused.value).startswith(f"lora adapter {name!r}") and why in str(
            refused.value
        ), refused.value
    pickled = root / "pickled"
    pickled.mkdir()
    shutil.copy(good / "adapter_config.json", pickled)
    (pickled / "adapter_model.bin").write_bytes(b"not loaded")
    with pytest.raises(AdapterError, match=r"'pickled'.*pickles are never loaded"):
        load_adapter("pickled", str(pickled), config, max_rank=4)


def test_a_bad_adapter_fails_start_up_and_settings_check_the_slots(qwen3_config):
    root, base, _ = qwen3_config
    bad = save_adapter(
        save_tiny("llama-kv3", root / "llama2"), root / "bad", seed=1, r=2, lora_alpha=2,
        target_modules=["o_proj"],
    )  # fmt: skip
    settings = ReplicaSettings.from_keys(
        **SETTINGS, model=str(base), lora_adapters=(("bad", str(bad)),)
    )
    with pytest.raises(AdapterError, match="lora adapter 'bad'"):
        ScoringEngine.from_settings(settings, warm=False)
    with pytest.raises(SettingsError, match=r"^max_loras: 1 slots cannot hold"):
        ReplicaSettings.from_mapping({"max_loras": 1, "lora_adapters": {"x": "/a", "y": "/b"}})
    with pytest.raises(SettingsError, match=r"^max_lora_rank"):
        ReplicaSettings.from_keys(max_loras=1, max_lora_rank=0)
    named = ReplicaSettings.from_mapping({"max_loras": 1, "lora_adapters": {"x": "/a"}})
    assert named.adapters.lora_adapters == (("x", "/a"),)
