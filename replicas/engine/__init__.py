"""The engine: scoring work in, ``[items, labels]`` log-probabilities out, on a mesh.

``scoring_engine`` (ScoringEngine: the layouts, compiled signatures, query cache and steps of
one replica), ``work_checks`` (the engine's own checks of a work), ``lora_slots`` (LoRA
adapters in their slots), ``layouts/`` (packing, jitted step and unpacking per layout),
``compiler`` (buckets to compiled signatures, background compiles), ``signature_record``
(what a signature is worth, kept across restarts), ``warm_coverage`` (warm-up that covers
every request the limits admit), ``query_cache`` (per-layer keys/values of recent queries),
``prefix_index`` (the longest cached prefix in whole blocks), ``memory`` (heap trimming after
compiles), ``group_engine`` (the same engine over a host group: leader and followers),
``slice_engine`` (a host group on a whole TPU slice it reserves at start).

Engine factories are named ``replicas.engine:ScoringEngine``, ``replicas.engine:GroupEngine``
and ``replicas.engine:SliceEngine`` (``replicas.serving.setup``).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ScoringEngine": ".scoring_engine",
        "GroupEngine": ".group_engine",
        "FollowerEngine": ".group_engine",
        "SliceEngine": ".slice_engine",
        "QueryCache": ".query_cache",
        "StepCompiler": ".compiler",
        "release_free_heap": ".memory",
    },
)
