"""Spark looks up top-level ``pyspark_*`` modules for a ``DefaultSource``: this one
makes ``format("rocketmq")`` work with no registration call."""

from rocketspark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
