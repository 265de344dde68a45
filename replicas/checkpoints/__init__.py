"""Checkpoints: where a model comes from and how its tensors become parameters.

``sources`` (jax-free: a model name, directory or GGUF file resolved to files; tokenizer and
Hugging Face config, GGUF metadata converted once), ``name_map`` (checkpoint tensor names and
layouts to ours), ``gguf_loading`` (GGUF tensors, dequantized, or Q8_0 kept as int8),
``compressed_tensors`` (llm-compressor's int8/fp8 W8A8 checkpoints, checked), ``loading``
(safetensors or GGUF into parameters sharded as they are read; never a pickle), ``demo``
(``python -m replicas.checkpoints.demo``).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ModelSource": ".sources",
        "ModelSourceError": ".sources",
        "resolve_model_source": ".sources",
        "load_tokenizer": ".sources",
        "load_hf_config": ".sources",
        "CheckpointError": ".name_map",
        "LoadedModel": ".loading",
        "load_model": ".loading",
    },
)
