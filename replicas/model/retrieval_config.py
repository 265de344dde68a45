"""Which late-interaction or sparse head a sentence-transformers 6 directory declares
(semantics 20; jax-free: the ingress reads it too).

- A ``MultiVectorEncoder`` directory (``config_sentence_transformers.json`` ``model_type``
  ``MultiVectorEncoder``): Transformer (its ``query_expansion``, ``query_length``,
  ``document_length`` in ``sentence_bert_config.json``) -> Dense layers on every token ->
  ``MultiVectorMask`` (the document skiplist) -> Normalize. PyLate's saves (``model_type``
  ``ColBERT``: Transformer and Dense only, the prefixes, lengths and skiplist in
  ``config_sentence_transformers.json``) are read as ``MultiVectorEncoder`` reads them:
  the mask (punctuation unless the save names a skiplist) and the normalization implied.
- A ``SparseEncoder`` directory (``model_type`` ``SparseEncoder``): a ``fill-mask``
  Transformer (or the older ``MLMTransformer``) over a ``*ForMaskedLM`` model ->
  ``SpladePooling``; ``max_active_dims`` in ``config_sentence_transformers.json``.

What scorejax cannot reproduce is refused at start-up, naming the file and field.
"""

from __future__ import annotations

import dataclasses
import string
from pathlib import Path
from typing import Any

from replicas.embed_contract import Hybrid, LateInteraction, PoolingHead, SparseOutput
from replicas.model.st_inputs import UnsupportedEmbeddingError, input_format, read_json

LATE_TYPES = ("MultiVectorEncoder", "ColBERT")
SPARSE_TYPES = ("SparseEncoder",)
_IDENTITY = "torch.nn.modules.linear.Identity"
_MODULE_KINDS = {
    "Transformer": "Transformer",
    "MLMTransformer": "Transformer",
    "Dense": "Dense",
    "MultiVectorMask": "MultiVectorMask",
    "Normalize": "Normalize",
    "SpladePooling": "SpladePooling",
}
_LATE_ORDER = ("Transformer", "Dense", "MultiVectorMask", "Normalize")


def _object(path: Path) -> dict[str, Any]:
    value = read_json(path) if path.is_file() else {}
    if not isinstance(value, dict):
        raise UnsupportedEmbeddingError(f"{path}: expected a JSON object")
    return value


def st_model_type(directory: Path | None) -> str | None:
    """``config_sentence_transformers.json``'s ``model_type`` (None: none saved)."""
    if directory is None:
        return None
    value = _object(directory / "config_sentence_transformers.json").get("model_type")
    return None if value is None else str(value)


def _modules(directory: Path) -> list[tuple[str, Path]]:
    """``modules.json`` as (module kind, its directory); a module scorejax cannot run is an
    error naming it."""
    entries = read_json(directory / "modules.json")
    modules = []
    for entry in entries if isinstance(entries, list) else []:
        name = str(entry.get("type", "")).rsplit(".", 1)[-1]
        if name not in _MODULE_KINDS:
            raise UnsupportedEmbeddingError(
                f"modules.json: module {entry.get('type')!r} is not supported for this model "
                f"(supported: {', '.join(sorted(_MODULE_KINDS))})"
            )
        modules.append((_MODULE_KINDS[name], directory / str(entry.get("path", ""))))
    root = directory.resolve()
    if not modules or modules[0][0] != "Transformer" or modules[0][1].resolve() != root:
        raise UnsupportedEmbeddingError("modules.json: the first module must be the Transformer")
    return modules


def dense_paths(directory: Path) -> list[Path]:
    """The folders of the Dense modules ``modules.json`` lists, in order (any model type)."""
    entries = read_json(directory / "modules.json")
    entries = entries if isinstance(entries, list) else []
    dense = [e for e in entries if str(e.get("type", "")).rsplit(".", 1)[-1] == "Dense"]
    return [directory / str(entry.get("path", "")) for entry in dense]


def _token_dense(path: Path, width: int) -> tuple[int, int, str]:
    config = _object(path / "config.json")
    inputs, outputs = int(config["in_features"]), int(config["out_features"])
    if str(config.get("activation_function", _IDENTITY)) != _IDENTITY or inputs != width:
        raise UnsupportedEmbeddingError(
            f"{path.name}/config.json: a token Dense of {inputs} -> {outputs} after {width} with "
            f"activation {config.get('activation_function')!r} (supported: Identity, in order)"
        )
    if config.get("module_input_name", "token_embeddings") != "token_embeddings":
        raise UnsupportedEmbeddingError(
            f"{path.name}/config.json: module_input_name {config['module_input_name']!r} "
            "(a late-interaction Dense reads token_embeddings)"
        )
    return inputs, outputs, "identity"


def _prompts(st_config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The prompts, PyLate's ``query_prefix`` / ``document_prefix`` in front of them."""
    prompts = {str(k): str(v) for k, v in (st_config.get("prompts") or {}).items() if v}
    for key, name in (("query_prefix", "query"), ("document_prefix", "document")):
        prefix = st_config.get(key)
        if prefix:
            prompts[name] = prefix + prompts.get(name, "").removeprefix(prefix)
    return tuple(sorted(prompts.items()))


def _expansion(transformer: dict[str, Any], st_config: dict[str, Any], pylate: bool) -> dict:
    """``query_expansion`` as MultiVectorEncoder resolves it (PyLate's flat fields too)."""
    if "query_expansion" in transformer:
        return transformer["query_expansion"] or {}
    if not pylate or st_config.get("do_query_expansion") is False:
        return {}
    attend = st_config.get("attend_to_expansion_tokens", st_config.get("attend_to_mask_tokens"))
    length = st_config.get("query_length") or 32
    return {"strategy": "fixed", "attend": bool(attend), "length": int(length)}


def _similarity(saved: Any) -> str:
    """The saved ``similarity_fn_name`` where MultiVectorEncoder takes it, else MaxSim (as
    it reads PyLate's ``cosine``)."""
    return str(saved) if saved in ("maxsim", "meanmaxsim") else "maxsim"


def late_head(directory: Path, hidden_size: int, max_seq_length: int | None) -> PoolingHead:
    """The PoolingHead (``late`` set) of a MultiVectorEncoder or PyLate directory."""
    st_config = _object(directory / "config_sentence_transformers.json")
    pylate = st_config.get("model_type") == "ColBERT"
    modules = _modules(directory)
    kinds = [kind for kind, _ in modules]
    order = [_LATE_ORDER.index(kind) if kind in _LATE_ORDER else -1 for kind in kinds]
    if -1 in order or order != sorted(order) or kinds.count("MultiVectorMask") > 1:
        raise UnsupportedEmbeddingError(
            f"modules.json: expected Transformer, Dense..., MultiVectorMask, Normalize; got {kinds}"
        )
    width, dense = hidden_size, []
    for kind, path in modules[1:]:
        if kind == "Dense":
            dense.append(_token_dense(path, width))
            width = dense[-1][1]
    mask = next((_object(p / "config.json") for k, p in modules if k == "MultiVectorMask"), None)
    skiplist = list(string.punctuation) if pylate else []
    if pylate and st_config.get("skiplist_words") is not None:
        skiplist = list(st_config["skiplist_words"])
    tasks: list[str] = ["document"]
    if mask is not None:
        if mask.get("keep_only_token_ids"):
            raise UnsupportedEmbeddingError(
                "2_MultiVectorMask/config.json: keep_only_token_ids (image patches) is not "
                "supported: scorejax embeds text"
            )
        skiplist = list(mask.get("skiplist_words") or [])
        tasks = mask.get("skiplist_tasks") or ["document"]
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    transformer = _object(directory / "sentence_bert_config.json")
    expansion = _expansion(transformer, st_config, pylate)
    lengths = {**{k: st_config.get(k) for k in ("query_length", "document_length")}, **transformer}
    late = LateInteraction(
        query_length=int(expansion["length"]) if expansion else None,
        expansion=str(expansion.get("strategy", "fixed")),
        attend_expansion=bool(expansion.get("attend", False)),
        expansion_token=expansion.get("token"),
        query_max_length=lengths.get("query_length"),
        document_length=lengths.get("document_length"),
        skiplist=tuple(str(word) for word in skiplist),
        skiplist_tasks=tuple(str(task) for task in tasks),
        similarity=_similarity(st_config.get("similarity_fn_name")),
    )
    return PoolingHead(
        pooling="tokens",
        normalize=pylate or kinds[-1] == "Normalize",
        dimension=width,
        dense=tuple(dense),
        prompts=_prompts(st_config),
        default_prompt_name=st_config.get("default_prompt_name"),
        max_seq_length=max_seq_length,
        inputs=input_format(directory, True, None),
        late=late,
    )


def sparse_head(directory: Path, vocab_size: int, max_seq_length: int | None) -> PoolingHead:
    """The PoolingHead (``sparse`` set) of a SparseEncoder directory."""
    st_config = _object(directory / "config_sentence_transformers.json")
    modules = _modules(directory)
    kinds = [kind for kind, _ in modules]
    if kinds != ["Transformer", "SpladePooling"]:
        raise UnsupportedEmbeddingError(
            f"modules.json: expected a fill-mask Transformer then SpladePooling, got {kinds} "
            "(a Router or SparseStaticEmbedding query side is not supported)"
        )
    pooling = _object(modules[1][1] / "config.json")
    active = st_config.get("max_active_dims")
    try:
        sparse = SparseOutput(
            pooling=str(pooling.get("pooling_strategy", "max")),
            activation=str(pooling.get("activation_function", "relu")),
            max_active_dims=None if active is None else int(active),
        )
    except ValueError as error:
        raise UnsupportedEmbeddingError(f"{modules[1][1].name}/config.json: {error}") from None
    return PoolingHead(
        pooling="splade",
        normalize=False,
        dimension=vocab_size,
        prompts=_prompts(st_config),
        default_prompt_name=st_config.get("default_prompt_name"),
        max_seq_length=max_seq_length,
        inputs=input_format(directory, True, None, masked_lm=True),
        sparse=sparse,
    )


HYBRID_HEADS = ("colbert_linear", "sparse_linear")  # BGE-M3's, beside its model
CONVERT_COMMAND = "python -m replicas.checkpoints.convert_pt"


def hybrid_files(directory: Path) -> dict[str, Path] | None:
    """BGE-M3's two head files as safetensors (None: the directory has neither). Its heads
    as shipped (``colbert_linear.pt``, ``sparse_linear.pt``) are pickles, never opened: an
    error names the command that converts them."""
    found = {name: directory / f"{name}.safetensors" for name in HYBRID_HEADS}
    if all(path.is_file() for path in found.values()):
        return found
    pickles = [f"{name}.pt" for name in HYBRID_HEADS if (directory / f"{name}.pt").is_file()]
    if pickles or any(path.is_file() for path in found.values()):
        raise UnsupportedEmbeddingError(
            f"{', '.join(pickles) or 'a BGE-M3 head'}: pickle files are never loaded; convert "
            f"both heads to safetensors with `{CONVERT_COMMAND} {directory}` (torch's "
            "weights-only loader)"
        )
    return None


def with_hybrid(head: PoolingHead, directory: Path, hidden_size: int) -> PoolingHead:
    """``head`` (the directory's dense pooling) with BGE-M3's heads where it has them."""
    files = hybrid_files(directory)
    if files is None:
        return head
    from safetensors import safe_open

    shapes = {}
    for name, path in files.items():
        with safe_open(str(path), "np") as tensors:
            shapes[name] = tuple(tensors.get_slice("weight").get_shape())
    colbert, sparse = shapes["colbert_linear"], shapes["sparse_linear"]
    if colbert[1:] != (hidden_size,) or sparse != (1, hidden_size):
        raise UnsupportedEmbeddingError(
            f"colbert_linear {colbert}, sparse_linear {sparse}: expected [C, {hidden_size}] "
            f"and [1, {hidden_size}]"
        )
    if head.pooling != "cls" or not head.normalize or head.dense:
        raise UnsupportedEmbeddingError(
            "BGE-M3: its dense vector is the normalized [CLS] state (1_Pooling cls, Normalize)"
        )
    return dataclasses.replace(head, hybrid=Hybrid(colbert_dimension=int(colbert[0])))
