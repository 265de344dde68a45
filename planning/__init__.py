"""Planning a TPU deployment here, without a TPU: whole engines compiled for a slice.

``tpu_check`` (``python -m planning.tpu_check``: every step of a serve plan compiled
deviceless for its slice topology, sharding and memory per chip checked),
``tpu_projection`` (step time projected from the compiled executables), ``plan``
(``python -m planning.plan``: every layout of a slice ranked by projected items/s, refusals
by HBM; ``layouts`` enumerates them, ``emit`` writes the winner's manifest) and
``serve_args`` (the app args a TPU plan starts from). Sits above ``replicas`` (it builds
engines) and ``cluster`` (topologies), so the planner lives here, not in ``cluster``.
"""
