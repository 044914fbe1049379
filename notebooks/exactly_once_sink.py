# Databricks notebook source
# MAGIC %md
# MAGIC # Exactly-once sink
# MAGIC A query copies a topic to another with `deliveryGuarantee=exactly_once` (the
# MAGIC default). We stop it mid-way, restart it from its checkpoint, and count: nothing
# MAGIC is missing and nothing is doubled.

# COMMAND ----------

# MAGIC %run ./_setup

# COMMAND ----------

import os

if "STORE" not in globals():  # a plain Python run: the %run above is only a comment
    exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_setup.py")).read())

# COMMAND ----------

import time

from rocketspark.store import Message, MessageStore

with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    store.create_topic("payments", queues=2)
    store.create_topic("payments-copy", queues=2)
    store.put_batch([Message("payments", f"payment-{i}", keys=[f"p-{i}"]) for i in range(3000)])


def start_copy():
    src = (spark.readStream.format("rocketmq").option("store", STORE)
           .option("topic", "payments").option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", 400).load())
    return (src.select("body", "keys").writeStream.format("rocketmq")
            .option("store", STORE).option("topic", "payments-copy")
            .option("checkpointLocation", os.path.join(WORK, "copy-chk"))
            .trigger(processingTime="0 seconds").start())


def copied() -> int:
    with MessageStore.open(STORE, **STORE_OPTIONS) as store:
        return sum(store.max_offset("payments-copy", i) for i in range(2))


def wait_for_copies(query, at_least: int, seconds: float) -> None:
    wait_for(lambda: copied() >= at_least, query, f"copying {at_least} payments", seconds)

# COMMAND ----------

# MAGIC %md Start the copy and stop it while it is running.

# COMMAND ----------

q = start_copy()
try:
    wait_for_copies(q, 800, seconds=120)
finally:
    q.stop()
print(f"copied before the stop: {copied()} of 3000")

# COMMAND ----------

# MAGIC %md Restart from the checkpoint and let it finish.

# COMMAND ----------

q = start_copy()
try:
    wait_for_copies(q, 3000, seconds=180)
    time.sleep(2)  # a batch that would copy anything twice has time to show it
    check_query(q, "copying the rest")
finally:
    q.stop()

# COMMAND ----------

copy = spark.read.format("rocketmq").option("store", STORE).option("topic", "payments-copy").load()
summary = copy.selectExpr("count(*) AS rows", "count(DISTINCT body) AS distinct_bodies")
display(summary)
row = summary.collect()[0]
check(row.rows == 3000 and row.distinct_bodies == 3000,
      f"payments-copy: expected 3000 rows, all distinct; got {row}")

# COMMAND ----------

# MAGIC %md Clean up: this run's store and checkpoints (a directory `_setup` made).

# COMMAND ----------

cleanup()
