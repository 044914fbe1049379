"""The Spark "rocketmq" data source: streaming and batch, source and sink.

``format("rocketmq")`` works without registration when rocketspark is installed
(the top-level module ``pyspark_rocketmq`` exposes :class:`RocketMQDataSource`
as ``DefaultSource``, which Spark looks up by itself); :func:`register` does it
explicitly. Options: :mod:`rocketspark.datasource.options`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from rocketspark.errors import ConfigError, RocketSparkError

if TYPE_CHECKING:  # pragma: no cover
    from rocketspark.datasource.sink import RocketMQBatchWriter, RocketMQStreamWriter
    from rocketspark.datasource.source import RocketMQBatchReader

# The source and the sink are imported by the methods that use them. Spark imports
# this module in processes that use neither (its lookup of ``pyspark_*`` modules, at
# the first load() of any format) or only one: a streaming query's planning runs in a
# Python process started for it, and what it imports delays the query's first
# trigger. tests/datasource/test_startup.py keeps the sink, the CLI and Delta out.

NAME = "rocketmq"


class RocketMQDataSource(DataSource):
    """Read and write RocketMQ topics of an embedded store."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Spark asks for the schema at load(): the moment to reject bad read options,
        # before any query runs (stream-only checks follow at start()).
        from rocketspark.datasource.options import parse_options
        from rocketspark.datasource.source import SCHEMA_DDL, SourcePlan

        SourcePlan.create(parse_options(self.options, "read"), streaming=None)
        return SCHEMA_DDL

    def reader(self, schema: Any) -> RocketMQBatchReader:
        from rocketspark.datasource.options import parse_options
        from rocketspark.datasource.source import (
            RocketMQBatchReader,
            RocketMQFilteringBatchReader,
            SourcePlan,
            called_for_filter_pushdown,
            columns_of,
        )

        columns = columns_of(schema)  # a .schema() of some columns: the rows have only those
        plan = SourcePlan.create(
            parse_options(self.options, "read"), streaming=False, columns=columns
        )
        if called_for_filter_pushdown():
            return RocketMQFilteringBatchReader(plan)
        return RocketMQBatchReader(plan)

    def streamReader(self, schema: Any) -> Any:
        from rocketspark.datasource.options import parse_options
        from rocketspark.datasource.source import RocketMQStreamReader, SourcePlan, columns_of

        try:
            columns = columns_of(schema)
            plan = SourcePlan.create(
                parse_options(self.options, "read"), streaming=True, columns=columns
            )
        except RocketSparkError as e:
            # pyspark's stream runner (4.0-4.2) answers an error raised here with an
            # UnboundLocalError of its own that ends the trace; raised from the
            # reader's first call instead, ours is the error the query fails with.
            return _RefusedStreamReader(e)
        return RocketMQStreamReader(plan)

    def writer(self, schema: Any, overwrite: bool) -> RocketMQBatchWriter:
        from rocketspark.datasource.options import parse_options
        from rocketspark.datasource.sink import RocketMQBatchWriter, SinkPlan

        if overwrite:
            raise ConfigError(
                "the rocketmq sink only appends: a topic cannot be overwritten (use mode('append'))"
            )
        return RocketMQBatchWriter(
            SinkPlan.create(parse_options(self.options, "write"), schema, streaming=False)
        )

    def streamWriter(self, schema: Any, overwrite: bool) -> RocketMQStreamWriter:
        from rocketspark.datasource.options import parse_options
        from rocketspark.datasource.sink import RocketMQStreamWriter, SinkPlan

        if overwrite:
            raise ConfigError("the rocketmq sink only appends (outputMode 'append')")
        return RocketMQStreamWriter(
            SinkPlan.create(parse_options(self.options, "write"), schema, streaming=True)
        )


class _RefusedStreamReader(DataSourceStreamReader):
    """A stream whose options were refused: every call raises that error."""

    def __init__(self, error: RocketSparkError):
        self.error = error

    def _refuse(self, *args: Any) -> Any:
        raise self.error

    # One refusing function for every call: pyspark's stubs give each method its own
    # signature, which a catch-all ``*args`` does not match.
    initialOffset = latestOffset = partitions = read = commit = _refuse  # type: ignore[assignment]

    def stop(self) -> None:
        pass


def register(spark: Any) -> None:
    """Register ``format("rocketmq")`` in ``spark`` (not needed when auto-discovery works)."""
    spark.dataSource.register(RocketMQDataSource)


__all__ = ["RocketMQDataSource", "register", "NAME"]
