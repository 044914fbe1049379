"""The source's row schema is the Arrow row schema the client reads, as Spark sees it."""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema

from rocketspark.client import ARROW_SCHEMA
from rocketspark.datasource.source import SCHEMA_DDL, SCHEMA_FIELDS


def test_schema_ddl_agrees_with_the_arrow_row_schema():
    spark_schema = from_arrow_schema(ARROW_SCHEMA)
    assert [(f.name, f.dataType.simpleString()) for f in spark_schema.fields] == SCHEMA_FIELDS
    assert SCHEMA_DDL.startswith("topic string, brokerName string, queueId int, queueOffset long")
    assert len(SCHEMA_FIELDS) == len(ARROW_SCHEMA) == 18
