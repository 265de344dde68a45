"""A replica's settings, in typed sections (jax-free).

``replica`` (ReplicaSettings: the sections composed, built from a config's flat keys or
sections, the checks that span sections, the request limits), ``model`` (ModelSettings),
``engine`` (EngineSettings: layouts, buckets, compiling), ``warmup`` (WarmupSettings, and
the workload the envelopes derive from), ``serving`` (BatchingSettings: batching and
admission; HttpSettings: request limits and access), ``placement`` (PlacementSettings),
``adapters`` (AdapterSettings: LoRA), ``common`` (SettingsError, bucket ladders).
"""

from replicas._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ReplicaSettings": ".replica",
        "SettingsError": ".common",
        "bucket_ladder": ".common",
        "ModelSettings": ".model",
        "DEFAULT_MODEL": ".model",
        "check_delimiter_in_vocab": ".model",
        "EngineSettings": ".engine",
        "WarmupSettings": ".warmup",
        "WarmupWorkload": ".warmup",
        "derive_envelopes": ".warmup",
        "BatchingSettings": ".serving",
        "HttpSettings": ".serving",
        "PlacementSettings": ".placement",
        "AdapterSettings": ".adapters",
    },
)
