"""A streaming query rocketmq → rocketmq, run as its own process so tests can SIGKILL it.

python pipeline.py STORE CHECKPOINT MODE   # MODE: available_now | forever
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

from rocketspark.session import local_session


def main() -> None:
    store, checkpoint, mode = sys.argv[1:4]
    spark = local_session("rocketspark-pipeline", delta=False)
    src = (
        spark.readStream.format("rocketmq")
        .option("store", store)
        .option("topic", "in")
        .option("startingOffsets", "earliest")
        .option("group", "pipeline")
        .option("maxOffsetsPerTrigger", "37")
        .load()
    )
    # body "q:i" and the same out queue per in queue: order is checkable downstream
    out = src.select(
        F.concat_ws(
            ":", F.col("queueId").cast("string"), F.col("queueOffset").cast("string")
        ).alias("body"),
        F.col("queueId").cast("string").alias("shardingKey"),
    )
    writer = (
        out.writeStream.format("rocketmq")
        .option("store", store)
        .option("topic", "out")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "available_now":
        q = writer.trigger(availableNow=True).start()
    else:
        q = writer.trigger(processingTime="0 seconds").start()
    print("started", flush=True)
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")


if __name__ == "__main__":
    main()
