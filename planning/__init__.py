"""Planning a TPU deployment here, without a TPU: whole engines compiled for a slice.

``tpu_check`` (``python -m planning.tpu_check``: every step of a serve plan compiled
deviceless for its slice topology, sharding and memory per chip checked) and
``tpu_projection`` (step time projected from the compiled executables). Sits above
``replicas`` (it builds engines) and ``cluster`` (topologies, manifests).
"""
