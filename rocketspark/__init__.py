"""rocketspark: Apache RocketMQ for Apache Spark.

``rocketspark.store`` is an embedded, memory-mapped RocketMQ broker store
(byte-compatible with a RocketMQ broker's store directory).
"""

__version__ = "0.1.0"
