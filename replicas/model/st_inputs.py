"""How sentence-transformers 6.2 prepares an embedding model's text (semantics 20; jax-free:
the ingress reads it too), as an ``InputFormat``.

sentence-transformers' Transformer module holds a ``modality_config``. It saves it in
``sentence_bert_config.json``; loading a sentence-transformers directory (``modules.json``)
whose config has none, it takes text only (a directory saved before modalities existed).
Building one from a bare transformers directory, it infers ``text``, plus ``message`` when
the tokenizer has a chat template. With ``message`` in the config, every text input is
rendered through the chat template (``app.embed_inputs``); otherwise it is tokenized as it
is. What scorejax cannot reproduce (another modality, another output, a processor setting it
does not apply) is refused here, at start-up, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replicas.embed_contract import MESSAGE_FORMATS, InputFormat

# sentence-transformers' config file names, in the order it tries them
ST_CONFIG_NAMES = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
MODALITIES = ("text", "message")
# a feature-extraction Transformer: the model's forward, its last_hidden_state as tokens
_ENTRY = {"method": "forward", "method_output_name": "last_hidden_state"}
_OUTPUT_NAME = "token_embeddings"
# model types whose template takes flat messages (sentence-transformers' InputFormatter)
_FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
_SIZE_KWARGS = ("padding", "truncation", "max_length", "return_tensors")


class UnsupportedEmbeddingError(ValueError):
    """The embedding model's files or settings are unusable (named in the message)."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UnsupportedEmbeddingError(f"{path}: not readable JSON: {error}") from None


def chat_template_of(directory: Path) -> Any:
    """The tokenizer's chat template as transformers loads it (``chat_template.jinja``,
    ``chat_template.json``, then ``tokenizer_config.json``); None: it has none."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = directory / name
        template = read_json(path).get("chat_template") if path.is_file() else None
        if template:
            return template
    if (directory / "additional_chat_templates").is_dir():
        return {p.stem: p.read_text() for p in (directory / "additional_chat_templates").iterdir()}
    return None


def message_format_of(template: Any, model_type: str | None) -> str:
    """``format: auto`` as sentence-transformers infers it: a known model type, else
    ``structured`` when the template reads typed content (or is not one string)."""
    if model_type in _FLAT_MODEL_TYPES:
        return "flat"
    if not isinstance(template, str) or not template:
        return "structured"
    return "structured" if any(p in template for p in _STRUCTURED_PATTERNS) else "flat"


def _st_config(directory: Path) -> dict[str, Any]:
    for name in ST_CONFIG_NAMES:
        if (directory / name).is_file():
            config = read_json(directory / name)
            return config if isinstance(config, dict) else {}
    return {}


def _check_modalities(config: dict[str, Any], entry_expected: dict[str, str]) -> dict[str, Any]:
    modalities = config["modality_config"]
    where = "sentence_bert_config.json: modality_config"
    if not isinstance(modalities, dict) or not modalities:
        raise UnsupportedEmbeddingError(
            f"{where}: expected an object of modalities, got {modalities!r}"
        )
    for name, entry in modalities.items():
        if name not in MODALITIES:
            raise UnsupportedEmbeddingError(
                f"{where}: modality {name!r} is not supported (scorejax embeds text: "
                f"{' and '.join(MODALITIES)})"
            )
        got = {key: entry.get(key) for key in _ENTRY} if isinstance(entry, dict) else entry
        if got != entry_expected:
            raise UnsupportedEmbeddingError(
                f"{where}: {name!r} reads {got!r}; supported: {entry_expected}"
            )
    output = config.get("module_output_name", _OUTPUT_NAME)
    if output != _OUTPUT_NAME:
        raise UnsupportedEmbeddingError(
            f"sentence_bert_config.json: module_output_name {output!r} is not supported "
            f"(supported: {_OUTPUT_NAME!r})"
        )
    return modalities


def _check_transformer(config: dict[str, Any], expected: str) -> None:
    task = config.get("transformer_task", expected)  # unsaved: the module's own (MLMTransformer)
    if task != expected:
        raise UnsupportedEmbeddingError(
            f"sentence_bert_config.json: transformer_task {task!r} is not supported here "
            f"(this model kind's: {expected!r})"
        )
    if config.get("do_lower_case"):
        raise UnsupportedEmbeddingError(
            "sentence_bert_config.json: do_lower_case is not applied by scorejax"
        )
    if config.get("tokenizer_name_or_path") is not None:
        raise UnsupportedEmbeddingError(
            "sentence_bert_config.json: tokenizer_name_or_path (a tokenizer from elsewhere) "
            "is not supported; keep the tokenizer in the directory"
        )


def _template_settings(
    config: dict[str, Any], chat: bool
) -> tuple[tuple[tuple[str, str], ...], bool]:
    """``processing_kwargs``: the chat template's variables (as JSON) and ``restore_suffix``;
    any other processor setting is refused (scorejax tokenizes with the tokenizer's own)."""
    where = "sentence_bert_config.json: processing_kwargs"
    kwargs = config.get("processing_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise UnsupportedEmbeddingError(f"{where}: expected an object, got {kwargs!r}")
    others = sorted(key for key, value in kwargs.items() if key != "chat_template" and value)
    if others:
        raise UnsupportedEmbeddingError(
            f"{where}: {others} are not applied by scorejax (it applies chat_template variables)"
        )
    template = dict(kwargs.get("chat_template") or {}) if chat else {}
    restore = template.pop("restore_suffix", True)
    sizes = sorted(set(template) & set(_SIZE_KWARGS))
    if sizes:
        raise UnsupportedEmbeddingError(
            f"{where}: chat_template {sizes} are not applied by scorejax (the model's "
            "max_seq_length and the request's truncation decide an input's length)"
        )
    return tuple(sorted((k, json.dumps(v)) for k, v in template.items())), bool(restore)


def input_format(
    directory: Path, st_directory: bool, model_type: str | None, masked_lm: bool = False
) -> InputFormat:
    """The InputFormat of the model in ``directory``: a sentence-transformers directory
    (``st_directory``: its ``modality_config``, text only when it has none) or a bare
    transformers directory (inferred from the tokenizer); raises UnsupportedEmbeddingError.
    ``masked_lm``: its Transformer is a ``fill-mask`` one reading the logits (a sparse
    model's)."""
    template = chat_template_of(directory)
    config = _st_config(directory) if st_directory else {}
    _check_transformer(config, "fill-mask" if masked_lm else "feature-extraction")
    entry = {**_ENTRY, "method_output_name": "logits"} if masked_lm else _ENTRY
    if not st_directory:
        modalities: dict[str, Any] = {"text": {}, **({"message": {}} if template else {})}
    elif "modality_config" in config:
        modalities = _check_modalities(config, entry)
    else:
        modalities = {"text": {}}
    chat = "message" in modalities
    variables, restore = _template_settings(config, chat)
    if not chat:
        return InputFormat()
    if not template:
        raise UnsupportedEmbeddingError(
            "sentence_bert_config.json: modality_config has 'message' (text rendered through "
            "the chat template) but the tokenizer has no chat template"
        )
    setting = modalities["message"].get("format", "auto")
    form = message_format_of(template, model_type) if setting == "auto" else setting
    if form not in MESSAGE_FORMATS:
        raise UnsupportedEmbeddingError(
            f"sentence_bert_config.json: modality_config message format {form!r} is not "
            f"supported (supported: {', '.join(MESSAGE_FORMATS)}, auto)"
        )
    return InputFormat("chat_template", form, variables, restore)
