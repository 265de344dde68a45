"""Serving: the Ray Serve deployment shim around an engine class.

``deployment`` (ScoringReplica: ``@serve.batch``, merged engine calls, health; the engine
class is loaded by name at start, so this stays jax-free for the ingress), ``merging``
(which waiting batches share an engine call), ``setup`` (settings, the model's
early checks, the engine factory), ``admission`` (expected queue wait and the overload
verdict), ``adapter_registry`` (the LoRA adapters an app serves, followed by every replica),
``metrics`` (Prometheus metrics of a replica).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ScoringReplica": ".deployment",
        "QueueEstimate": ".admission",
        "admit": ".admission",
        "AdapterRegistry": ".adapter_registry",
        "ReplicaMetrics": ".metrics",
    },
)
