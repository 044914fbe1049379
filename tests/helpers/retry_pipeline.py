"""A RetryPipeline run as its own process, so a test can SIGKILL it.

python retry_pipeline.py STORE CHECKPOINT   # runs until both bad messages are dead
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import functions as F

from rocketspark.deadletter import RetryPipeline
from rocketspark.session import local_session
from rocketspark.store import MessageStore

FAST = {"messageDelayLevel": " ".join(["1s"] * 18)}


def main() -> None:
    store, checkpoint = sys.argv[1:3]
    spark = local_session("rocketspark-retry-pipeline", delta=False)

    def process(batch_df, batch_id):
        good = batch_df.where(~F.col("body").cast("string").endswith("-bad"))
        # the successful rows' output, idempotent per batch id
        (
            good.select("body")
            .write.format("rocketmq")
            .option("store", store)
            .option("topic", "done")
            .option("txnAppId", "retry-test")
            .option("txnVersion", str(batch_id))
            .options(**{f"rocketmq.{k}": v for k, v in FAST.items()})
            .mode("append")
            .save()
        )
        return batch_df.where(F.col("body").cast("string").endswith("-bad")).select(
            "commitLogOffset", F.lit("bad input").alias("reason")
        )

    pipe = RetryPipeline(
        spark,
        topic="in",
        group="g",
        process=process,
        checkpoint=checkpoint,
        store=store,
        store_options=FAST,
        max_offsets_per_trigger=7,
    )
    q = pipe.start(processing_time="200 milliseconds")
    print("started", flush=True)
    with MessageStore.open(store, **FAST) as s:
        while True:
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            if s.has_topic("%DLQ%g") and s.max_offset("%DLQ%g", 0) >= 2:
                break
            time.sleep(0.3)
    time.sleep(1)
    q.stop()


if __name__ == "__main__":
    main()
