"""The source's row schema is the Arrow row schema the client reads, as Spark sees it."""

from __future__ import annotations

import re

import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from rocketspark.client import ARROW_SCHEMA
from rocketspark.datasource.source import SCHEMA_DDL, SCHEMA_FIELDS


def test_schema_ddl_agrees_with_the_arrow_row_schema():
    spark_schema = from_arrow_schema(ARROW_SCHEMA)
    assert [(f.name, f.dataType.simpleString()) for f in spark_schema.fields] == SCHEMA_FIELDS
    assert SCHEMA_DDL.startswith("topic string, brokerName string, queueId int, queueOffset long")
    assert len(SCHEMA_FIELDS) == len(ARROW_SCHEMA) == 18


@pytest.mark.spark
def test_the_sources_own_schema_reads_every_column_and_some_columns_read_those(spark):
    from rocketspark.datasource.source import columns_of

    assert columns_of(None) is None
    assert columns_of(spark.createDataFrame([], SCHEMA_DDL).schema) is None  # as Spark parses it
    some = spark.createDataFrame([], "tags string, body binary, keys array<string>").schema
    assert columns_of(some) == ("tags", "body", "keys")


@pytest.mark.parametrize(
    "fields, message",
    [
        ([("offset", LongType(), True)], "no column 'offset'"),
        ([("Body", BinaryType(), True)], "no column 'Body' (did you mean 'body'?)"),
        (
            [("queueOffset", IntegerType(), True)],
            "'queueOffset' is long in the rocketmq source, not int",
        ),
        (
            [("keys", ArrayType(StringType(), containsNull=False), True)],
            "'keys' is array<string> in the rocketmq source with nullable elements and values",
        ),
        ([("body", BinaryType(), False)], "'body' of the rocketmq source is nullable"),
        ([("body", BinaryType(), True)] * 2, "column 'body' is given twice"),
        ([], "cannot read no column"),
    ],
)
def test_a_schema_that_is_not_some_of_the_columns_is_refused_naming_the_column(fields, message):
    from rocketspark.datasource.source import columns_of
    from rocketspark.errors import ConfigError

    schema = StructType([StructField(n, t, nullable) for n, t, nullable in fields])
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        columns_of(schema)
    if "nullable:" not in str(e.value):
        assert SCHEMA_DDL in str(e.value)  # the columns a schema may pick
