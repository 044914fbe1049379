"""RocketMQ's vocabulary, shared by the embedded store and the wire.

Messages and their flags (``model``), the CommitLog record grammar (``record``)
and the byte gathering behind the columnar paths (``byte_gather``). Nothing here
imports the store, the client or Spark: only :mod:`rocketspark.errors`.
"""
