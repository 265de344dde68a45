"""Which pooling an embedding model asks for (semantics 20; jax-free: the ingress reads it too).

Two kinds of directory are embedding models:

- A sentence-transformers directory (``modules.json``): Transformer (the Hugging Face model
  at the directory's root) -> Pooling (``1_Pooling/config.json``: ``lasttoken``, ``mean`` or
  ``cls``, ``include_prompt``) -> optional Dense layers -> optional Normalize, with its
  prompts in ``config_sentence_transformers.json`` and its ``max_seq_length`` in
  ``sentence_bert_config.json`` (sentence-transformers 6 keeps it as the tokenizer's
  ``model_max_length``). It is served with no other setting.
- A bare transformers base model (``Qwen3Model``, ``LlamaModel``, ...: no LM head), or any
  supported model with the ``pooling`` setting: pooled as the ``pooling`` and ``normalize``
  settings say (default: the last token, normalized).

Dense weights are read only from safetensors (``replicas.checkpoints.dense``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from replicas.embed_contract import POOLINGS, InputFormat, PoolingHead
from replicas.model.family.fields import text_config
from replicas.model.family.registry import BASE_ARCHITECTURES, ENCODERS, MASKED_LM_ARCHITECTURES
from replicas.model.head_config import is_cross_encoder, position_offset
from replicas.model.retrieval_config import (
    LATE_TYPES,
    SPARSE_TYPES,
    late_head,
    sparse_head,
    st_model_type,
    with_hybrid,
)
from replicas.model.st_inputs import UnsupportedEmbeddingError, input_format, read_json
from replicas.settings import ModelSettings, SettingsError

ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
}
_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
_LEGACY_MODES = {
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
_NO_LIMIT = 1 << 40  # tokenizers without a limit say int(1e30); anything this large is none


def is_base_model(hf: Any) -> bool:
    return any(arch in BASE_ARCHITECTURES for arch in getattr(hf, "architectures", None) or ())


def _read_json(path: Path) -> dict[str, Any]:
    value = read_json(path)
    if not isinstance(value, dict | list):
        raise UnsupportedEmbeddingError(f"{path}: expected a JSON object")
    return value  # type: ignore[return-value]


def st_modules(directory: Path) -> list[tuple[str, Path]]:
    """``modules.json`` as (module kind, its directory), in order; errors name a module
    scorejax cannot run."""
    entries = _read_json(directory / "modules.json")
    modules: list[tuple[str, Path]] = []
    for entry in entries if isinstance(entries, list) else []:
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _MODULES:
            raise UnsupportedEmbeddingError(
                f"modules.json: module {entry.get('type')!r} is not supported "
                f"(supported: {', '.join(_MODULES)})"
            )
        modules.append((kind, directory / str(entry.get("path", ""))))
    kinds = [kind for kind, _ in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k in kinds[2:] for k in _MODULES[:2]):
        raise UnsupportedEmbeddingError(
            f"modules.json: expected Transformer, Pooling, then Dense/Normalize, got {kinds}"
        )
    if modules[0][1].resolve() != directory.resolve():
        raise UnsupportedEmbeddingError(
            f"modules.json: the Transformer must be the directory's root (path ''), got "
            f"{modules[0][1].name!r}"
        )
    if "Normalize" in kinds[2:-1]:
        raise UnsupportedEmbeddingError("modules.json: Normalize must be the last module")
    return modules


def _pooling_mode(config: dict[str, Any]) -> str:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_MODES.items() if config.get(key)]
        others = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
        if len(others) != len(modes):
            raise UnsupportedEmbeddingError(f"1_Pooling: pooling modes {others} not supported")
        mode = modes
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    if mode not in POOLINGS:
        raise UnsupportedEmbeddingError(f"1_Pooling: pooling_mode {mode!r} not in {POOLINGS}")
    return str(mode)


def _dense(path: Path, width: int) -> tuple[int, int, str]:
    config = _read_json(path / "config.json")
    in_features, out_features = int(config["in_features"]), int(config["out_features"])
    activation = ACTIVATIONS.get(str(config.get("activation_function")))
    if activation is None:
        raise UnsupportedEmbeddingError(
            f"{path.name}: activation_function {config.get('activation_function')!r} not in "
            f"{sorted(ACTIVATIONS)}"
        )
    if config.get("use_residual") or in_features != width:
        raise UnsupportedEmbeddingError(
            f"{path.name}: a Dense of {in_features} inputs after {width} (residual: "
            f"{bool(config.get('use_residual'))}) is not supported"
        )
    return in_features, out_features, activation


def _max_seq_length(directory: Path) -> int | None:
    for name, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        path = directory / name
        value = _read_json(path).get(key) if path.is_file() else None
        if isinstance(value, int | float) and 0 < value < _NO_LIMIT:
            return int(value)
    return None


def st_pooling_head(
    directory: Path, hidden_size: int, model_type: str | None = None
) -> PoolingHead:
    """The PoolingHead of a sentence-transformers directory."""
    modules = st_modules(directory)
    inputs = input_format(directory, True, model_type)
    pooling = _read_json(modules[1][1] / "config.json")
    width, dense = hidden_size, []
    for kind, path in modules[2:]:
        if kind == "Dense":
            layer = _dense(path, width)
            dense.append(layer)
            width = layer[1]
    st_config_path = directory / "config_sentence_transformers.json"
    st_config = _read_json(st_config_path) if st_config_path.is_file() else {}
    prompts = st_config.get("prompts") or {}
    default = st_config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise UnsupportedEmbeddingError(
            f"config_sentence_transformers.json: default_prompt_name {default!r} is not a prompt"
        )
    return PoolingHead(
        pooling=_pooling_mode(pooling),
        normalize=modules[-1][0] == "Normalize",
        dimension=width,
        include_prompt=bool(pooling.get("include_prompt", True)),
        dense=tuple(dense),
        prompts=tuple(sorted((str(k), str(v)) for k, v in prompts.items())),
        default_prompt_name=default,
        max_seq_length=_max_seq_length(directory),
        inputs=inputs,
    )


def _within_positions(head: PoolingHead, hf: Any) -> PoolingHead:
    """An encoder's inputs within its learned positions (beyond them there are none)."""
    archs = getattr(hf, "architectures", None) or ()
    families = {**BASE_ARCHITECTURES, **MASKED_LM_ARCHITECTURES}
    if not any(families.get(arch) in ENCODERS for arch in archs):
        return head
    positions = int(hf.max_position_embeddings) - position_offset(hf)
    limit = min(head.max_seq_length or positions, positions)
    return dataclasses.replace(head, max_seq_length=limit)


def declared_matryoshka(hf: Any) -> tuple[int, ...] | None:
    """The Matryoshka sizes the model's ``config.json`` declares, as vLLM reads them:
    ``matryoshka_dimensions`` (those), else ``is_matryoshka: true`` (any: ``()``), else None."""
    declared = getattr(hf, "matryoshka_dimensions", None)
    if declared:
        if not isinstance(declared, list | tuple) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in declared
        ):
            raise UnsupportedEmbeddingError(
                f"config.json: matryoshka_dimensions must be positive ints, got {declared!r}"
            )
        return tuple(sorted(set(declared)))
    return () if getattr(hf, "is_matryoshka", False) is True else None


def with_matryoshka(head: PoolingHead, model: ModelSettings) -> PoolingHead:
    """``head`` with the Matryoshka sizes the ``model`` settings make of its own (the
    ``matryoshka_dimensions`` setting, else ``is_matryoshka``: true keeps the declared
    sizes or allows any, false none); a size past the vector is a SettingsError."""
    cuts = head.matryoshka
    if model.matryoshka_dimensions is not None:
        cuts = tuple(sorted(set(model.matryoshka_dimensions)))
    elif model.is_matryoshka is not None:
        cuts = (cuts or ()) if model.is_matryoshka else None
    if cuts and max(cuts) > head.dimension:
        raise SettingsError(
            f"matryoshka_dimensions: {list(cuts)} must be within 1..{head.dimension} (the "
            "model's dimension)"
        )
    return dataclasses.replace(head, matryoshka=cuts)


def served_pooling_head(
    directory: Path | None, hf: Any, model: ModelSettings
) -> PoolingHead | None:
    """The PoolingHead the ``model`` settings serve (``pooling_head_for`` with their pooling,
    normalization and Matryoshka sizes); Matryoshka settings on a model that embeds nothing
    are a SettingsError."""
    head = pooling_head_for(directory, hf, model.pooling, model.normalize)
    if head is None:
        if model.matryoshka_dimensions is not None or model.is_matryoshka is not None:
            raise SettingsError(
                "matryoshka_dimensions / is_matryoshka: the model is not an embedding model"
            )
        return None
    return with_matryoshka(head, model)


def pooling_head_for(
    directory: Path | None, hf: Any, pooling: str | None = None, normalize: bool | None = None
) -> PoolingHead | None:
    """The model's PoolingHead, or None for a causal LM or score-head model. ``directory``:
    the Hugging Face directory (None for a GGUF file); ``pooling``/``normalize``: the
    settings of that name (for a base model or a causal LM served as an embedder). Its
    Matryoshka sizes are those ``config.json`` declares (``served_pooling_head``: the
    settings' too)."""
    hidden = int(text_config(hf).hidden_size)
    if is_cross_encoder(hf) and pooling is None and normalize is None:
        return None  # a CrossEncoder directory (modules.json: its Transformer alone)
    if directory is not None and (directory / "modules.json").is_file():
        if pooling is not None or normalize is not None:
            raise UnsupportedEmbeddingError(
                "pooling: a sentence-transformers directory sets its own pooling and "
                "normalization (1_Pooling, Normalize); leave pooling and normalize unset"
            )
        return _declared(_within_positions(_st_head(directory, hf, hidden), hf), hf)
    if pooling is None and normalize is None and not is_base_model(hf):
        return None
    if pooling is not None and pooling not in POOLINGS:
        raise UnsupportedEmbeddingError(f"pooling: must be one of {POOLINGS}, got {pooling!r}")
    head = PoolingHead(
        pooling=pooling or "lasttoken",
        normalize=True if normalize is None else bool(normalize),
        dimension=hidden,
        max_seq_length=_max_seq_length(directory) if directory is not None else None,
        # as sentence-transformers loads a bare directory: the chat template when it has one
        inputs=input_format(directory, False, getattr(hf, "model_type", None))
        if directory is not None
        else InputFormat(),
    )
    return _declared(_within_positions(head, hf), hf)


def _st_head(directory: Path, hf: Any, hidden: int) -> PoolingHead:
    """A sentence-transformers directory's head, by the model type it saved."""
    model_type = st_model_type(directory)
    if model_type in LATE_TYPES:
        return late_head(directory, hidden, _max_seq_length(directory))
    if model_type in SPARSE_TYPES:
        vocab = int(text_config(hf).vocab_size)
        return sparse_head(directory, vocab, _max_seq_length(directory))
    head = st_pooling_head(directory, hidden, getattr(hf, "model_type", None))
    return with_hybrid(head, directory, hidden)


def _declared(head: PoolingHead, hf: Any) -> PoolingHead:
    """``head`` with the Matryoshka sizes ``config.json`` declares (past its vector: an
    error naming them)."""
    cuts = declared_matryoshka(hf)
    if cuts and max(cuts) > head.dimension:
        raise UnsupportedEmbeddingError(
            f"config.json: matryoshka_dimensions {list(cuts)} past the model's dimension "
            f"{head.dimension}"
        )
    return dataclasses.replace(head, matryoshka=cuts)
