"""rocketspark: Apache RocketMQ for Apache Spark.

``rocketspark.store`` is an embedded, memory-mapped RocketMQ broker store
(byte-compatible with a RocketMQ broker's store directory);
``rocketspark.datasource`` is the Spark data source ``format("rocketmq")``.
"""

__version__ = "0.1.0"


def register(spark):
    """Register the Spark data source ``format("rocketmq")`` in a SparkSession."""
    from rocketspark.datasource import register as _register

    _register(spark)
