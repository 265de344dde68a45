"""The scoring replicas: everything that runs on an accelerator, grouped by its seams.

Layer order inside (each imports only what is listed before it):

- ``contract`` (and ``embed_contract``), ``settings`` (a package of typed sections): the
  jax-free ingress/replica contract (token ids in, ``[items, labels]`` log-probabilities out;
  prompt log-probs; embedding vectors) and the typed replica settings;
- ``model``: the Flax causal LM (Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3), score and
  pooling heads, LoRA slots, attention (XLA reference, Pallas and cuDNN kernels), masks,
  parameter layout and sharding axes, FLOP counts, the size catalog;
- ``checkpoints``: where a model comes from (Hugging Face directories, GGUF files, the
  packaged default) and how its tensors become sharded parameters;
- ``engine``: the scoring engine (layouts that pack work into static shapes, jitted steps,
  compiled signatures, the query cache) and its host-group form;
- ``serving``: the Ray Serve deployment shim that takes an engine class, admission, metrics.

Mesh, sharding rules and host-group mechanics come from ``cluster`` below this package.
"""
