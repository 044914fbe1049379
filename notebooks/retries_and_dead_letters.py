# Databricks notebook source
# MAGIC %md
# MAGIC # Retries and dead letters
# MAGIC A pipeline whose processing step fails some messages. rocketspark sends them back
# MAGIC to `%RETRY%group` with RocketMQ's growing delays (shortened here), reads them
# MAGIC again in the same query, and after 16 retries parks them in `%DLQ%group`. Both
# MAGIC topics are mirrored into Delta tables; we query the dead letters and replay them.

# COMMAND ----------

# MAGIC %run ./_setup

# COMMAND ----------

import os

if "STORE" not in globals():  # a plain Python run: the %run above is only a comment
    exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_setup.py")).read())

# COMMAND ----------

import json
import time

from rocketspark.deadletter import RetryPipeline, materialize, replay
from rocketspark.store import Message, MessageStore

with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    store.create_topic("shipments", queues=2)
    store.put_batch([Message("shipments", json.dumps({"id": i, "weight": -1 if i % 10 == 7
                                                      else i}), keys=[f"s-{i}"])
                     for i in range(50)])

# COMMAND ----------

# MAGIC %md
# MAGIC The processing step: a shipment with a negative weight fails. It returns the failed
# MAGIC rows (with `commitLogOffset`) and a `reason`.

# COMMAND ----------

from pyspark.sql import functions as F

processed = []


def process(batch_df, batch_id):
    parsed = batch_df.select("commitLogOffset", "reconsumeTimes",
                             F.get_json_object(F.col("body").cast("string"), "$.weight")
                             .cast("int").alias("weight"))
    processed.extend(r.commitLogOffset for r in parsed.where("weight >= 0").collect())
    return parsed.where("weight < 0").select(
        "commitLogOffset", F.concat(F.lit("negative weight, attempt "),
                                    (F.col("reconsumeTimes") + 1).cast("string")).alias("reason"))


pipeline = RetryPipeline(spark, topic="shipments", group="shipping", process=process,
                         checkpoint=os.path.join(WORK, "shipping-chk"), store=STORE,
                         store_options=STORE_OPTIONS)
query = pipeline.start(processing_time="500 milliseconds")

# COMMAND ----------

# MAGIC %md Wait until the five bad shipments are dead letters (16 retries each).

# COMMAND ----------

with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    try:
        wait_for(lambda: store.has_topic("%DLQ%shipping")
                 and store.max_offset("%DLQ%shipping", 0) >= 5,
                 query, "five shipments becoming dead letters", timeout=300, poll=1)
    finally:
        query.stop()
check(len(set(processed)) == 45, f"expected 45 shipments processed, got {len(set(processed))}")

# COMMAND ----------

retry_table = os.path.join(WORK, "tables", "shipping_retries")
dlq_table = os.path.join(WORK, "tables", "shipping_dead_letters")
for q in materialize(spark, group="shipping", retry_table=retry_table, dlq_table=dlq_table,
                     checkpoint=os.path.join(WORK, "materialize-chk"), store=STORE,
                     store_options=STORE_OPTIONS, available_now=True):
    finish(q, "materializing the retry and dead-letter tables")

# COMMAND ----------

# MAGIC %md The dead letters, as a Delta table: one row each, with the reason.

# COMMAND ----------

dead = spark.read.format("delta").load(dlq_table)
display(dead.select("originTopic", "originMsgId", "keys", "reconsumeTimes", "reason",
                    "firstFailureAt", "deadAt", "replayedAt"))
check(dead.count() == 5 and dead.where("reconsumeTimes = 16").count() == 5,
      f"expected 5 dead letters, each after 16 retries: {dead.collect()}")
attempts = spark.read.format("delta").load(retry_table).groupBy("originMsgId").count()
check([r["count"] for r in attempts.collect()] == [16] * 5,
      f"expected 16 retries of each: {attempts.collect()}")

# COMMAND ----------

# MAGIC %md
# MAGIC Replay the dead letters of two shipments to `shipments`. The table records the
# MAGIC replay; replaying them again does nothing unless forced.

# COMMAND ----------

n = replay(spark, dlq_table=dlq_table, condition="array_contains(keys, 's-7') OR "
           "array_contains(keys, 's-17')", store=STORE, store_options=STORE_OPTIONS)
again = replay(spark, dlq_table=dlq_table, condition="array_contains(keys, 's-7')",
               store=STORE, store_options=STORE_OPTIONS)
print(f"replayed {n}, then {again}")
check((n, again) == (2, 0), f"replayed {n} then {again}; expected 2 then 0")
display(spark.read.format("delta").load(dlq_table).select("keys", "replayedAt", "replayId"))

# COMMAND ----------

# MAGIC %md Clean up: this run's store and checkpoints (a directory `_setup` made).

# COMMAND ----------

cleanup()
