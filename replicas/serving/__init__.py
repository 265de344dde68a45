"""Serving: the Ray Serve deployment shim around an engine class.

``deployment`` (ScoringReplica: settings, engine factory, ``@serve.batch``, health; the
engine is imported lazily, so this stays jax-free for the ingress), ``admission`` (expected
queue wait and the overload verdict), ``metrics`` (Prometheus metrics of a replica).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ScoringReplica": ".deployment",
        "ReplicaRejected": ".deployment",
        "QueueEstimate": ".admission",
        "admit": ".admission",
        "ReplicaMetrics": ".metrics",
    },
)
