"""A pipeline through Spark Connect (how Databricks serverless and thin clients run).

Usage: python -m tests.helpers.connect_pipeline WORKDIR

Starts a local Spark Connect server (``remote("local[2]")``), reads a topic in a
batch, copies it to another topic with a stream (Trigger.AvailableNow, exactly
once), and prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rocketspark.store import Message, MessageStore


def main() -> None:
    work = sys.argv[1]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    store_dir = os.path.join(work, "store")
    with MessageStore.open(store_dir) as s:
        s.create_topic("orders", queues=2)
        s.create_topic("out", queues=2)
        s.put_batch([Message("orders", b"o%d" % i, tags="created") for i in range(10)])
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    df = spark.read.format("rocketmq").option("store", store_dir).option("topic", "orders").load()
    rows = (
        df.select("queueId", "queueOffset", F.col("body").cast("string").alias("b"))
        .orderBy("queueId", "queueOffset")
        .collect()
    )
    q = (
        spark.readStream.format("rocketmq")
        .option("store", store_dir)
        .option("topic", "orders")
        .option("startingOffsets", "earliest")
        .load()
        .select(F.upper(F.col("body").cast("string")).alias("body"))
        .writeStream.format("rocketmq")
        .option("store", store_dir)
        .option("topic", "out")
        .option("checkpointLocation", os.path.join(work, "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    error = q.exception()
    spark.stop()
    with MessageStore.open(store_dir) as s:
        out = sorted(m.body.decode() for qid in (0, 1) for m in s.pull("out", qid, 0, 100).messages)
    print(
        json.dumps(
            {
                "read": [[r.queueId, r.queueOffset, r.b] for r in rows],
                "error": None if error is None else str(error),
                "out": out,
            }
        )
    )


if __name__ == "__main__":
    main()
