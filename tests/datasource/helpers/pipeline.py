"""A streaming query rocketmq → rocketmq, run as its own process so tests can SIGKILL it.

python pipeline.py OPTIONS IN OUT GROUP CHECKPOINT MODE   # MODE: available_now | forever

OPTIONS is a JSON object of the data source options that reach the RocketMQ
(a backend's ``options``); IN and OUT are the topics, GROUP the source's group.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import functions as F

from rocketspark.session import local_session


def main() -> None:
    options, topic_in, topic_out, group, checkpoint, mode = sys.argv[1:7]
    where = json.loads(options)
    spark = local_session("rocketspark-pipeline", delta=False)
    src = (
        spark.readStream.format("rocketmq")
        .options(**where)
        .option("topic", topic_in)
        .option("startingOffsets", "earliest")
        .option("group", group)
        .option("maxOffsetsPerTrigger", "37")
        .load()
    )
    # body "broker:q:i" and the same out queue per in queue: order is checkable downstream
    queue = F.concat_ws(":", F.col("brokerName"), F.col("queueId").cast("string"))
    out = src.select(
        F.concat_ws(":", queue, F.col("queueOffset").cast("string")).alias("body"),
        queue.alias("shardingKey"),
    )
    writer = (
        out.writeStream.format("rocketmq")
        .options(**where)
        .option("topic", topic_out)
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
