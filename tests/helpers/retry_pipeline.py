"""A RetryPipeline run as its own process, so a test can SIGKILL it.

python retry_pipeline.py SPEC CHECKPOINT   # runs until both bad messages are dead

SPEC is a JSON object: ``options`` (the data source options that reach the
RocketMQ), ``api`` (deadletter's keyword arguments that reach it), ``ref``
(its ClientRef's kind, address and options), and the topics ``in`` and
``done`` and the group ``group`` of this run.
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import functions as F

from rocketspark.client import ClientRef
from rocketspark.deadletter import RetryPipeline
from rocketspark.session import local_session


def main() -> None:
    spec, checkpoint = json.loads(sys.argv[1]), sys.argv[2]
    kind, address, options = spec["ref"]
    client = ClientRef(kind, address, tuple(tuple(o) for o in options)).connect()
    spark = local_session("rocketspark-retry-pipeline", delta=False)

    def process(batch_df, batch_id):
        good = batch_df.where(~F.col("body").cast("string").endswith("-bad"))
        # the successful rows' output, idempotent per batch id
        (
            good.select("body")
            .write.format("rocketmq")
            .options(**spec["options"])
            .option("topic", spec["done"])
            .option("txnAppId", "retry-test")
            .option("txnVersion", str(batch_id))
            .mode("append")
            .save()
        )
        # by commitLogOffset on a store (as pipelines did before msgIds), by msgId on a
        # cluster (where an offset names no message)
        key = "commitLogOffset" if "store" in spec["options"] else "msgId"
        return batch_df.where(F.col("body").cast("string").endswith("-bad")).select(
            key, F.lit("bad input").alias("reason")
        )

    pipe = RetryPipeline(
        spark,
        topic=spec["in"],
        group=spec["group"],
        process=process,
        checkpoint=checkpoint,
        max_offsets_per_trigger=7,
        **spec["api"],
    )
    q = pipe.start(processing_time="200 milliseconds")
    print("started", flush=True)
    dlq = f"%DLQ%{spec['group']}"
    while True:
        if q.exception() is not None:
            raise SystemExit(f"query failed: {q.exception()}")
        if client.has_topic(dlq) and sum(client.max_offset(mq) for mq in client.queues(dlq)) >= 2:
            break
        time.sleep(0.3)
    time.sleep(1)
    q.stop()


if __name__ == "__main__":
    main()
