"""The engine: scoring work in, ``[items, labels]`` log-probabilities out, on a mesh.

``scoring_engine`` (ScoringEngine: the layout, compiled signatures, query cache and steps of
one replica), ``layouts/`` (packing, jitted step and unpacking per layout), ``compiler``
(buckets to compiled signatures, background compiles, the signature record), ``query_cache``
(per-layer keys/values of recent queries), ``memory`` (heap trimming after compiles),
``group_engine`` (the same engine over a host group: leader and followers), ``slice_engine``
(a host group on a whole TPU slice it reserves at start).

Engine factories are named ``replicas.engine:ScoringEngine`` and ``replicas.engine:GroupEngine``.
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
