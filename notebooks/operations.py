# Databricks notebook source
# MAGIC %md
# MAGIC # Operations
# MAGIC Topics and queues, a consumer group's lag over time while a stream catches up,
# MAGIC and finding a message by key.

# COMMAND ----------

# MAGIC %run ./_setup

# COMMAND ----------

import os

if "STORE" not in globals():  # a plain Python run: the %run above is only a comment
    exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_setup.py")).read())

# COMMAND ----------

import threading
import time

from rocketspark.store import Message, MessageStore

with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    store.create_topic("events", queues=4)
    store.put_batch([Message("events", f"event-{i}", keys=[f"e-{i}"], tags="audit")
                     for i in range(4000)])
    topics = spark.createDataFrame(
        [(t.name, t.read_queue_nums, sum(store.max_offset(t.name, q)
                                          for q in range(t.read_queue_nums)))
         for t in store.list_topics()], "topic string, queues int, messages long")
display(topics)

# COMMAND ----------

# MAGIC %md
# MAGIC A stream reads `events` 500 offsets per trigger with the group `auditors`; we
# MAGIC sample the group's lag while it works.

# COMMAND ----------

stream = (spark.readStream.format("rocketmq").option("store", STORE).option("topic", "events")
          .option("group", "auditors").option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", 500).load())
query = (stream.writeStream.format("noop")
         .option("checkpointLocation", os.path.join(WORK, "auditors-chk"))
         .trigger(processingTime="0 seconds").start())
samples = []
with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    t0 = time.time()

    def caught_up():
        lag = sum(store.lag("auditors", "events").values()) if store.committed_offset(
            "auditors", "events", 0) is not None else 4000
        samples.append((round(time.time() - t0, 2), lag))
        return lag == 0

    try:
        wait_for(caught_up, query, "the auditors stream catching up with events", timeout=120)
    finally:
        query.stop()
lag_df = spark.createDataFrame(samples, "seconds double, lag long")
display(lag_df)  # on Databricks: choose a line chart of lag over seconds
for seconds, lag in samples[:: max(1, len(samples) // 15)]:
    print(f"{seconds:6.2f}s {'#' * int(40 * lag / 4000):40} {lag}")
check(max(lag for _, lag in samples) > 0, f"the lag was never above 0: {samples}")

# COMMAND ----------

# MAGIC %md Find a message by key (RocketMQ's IndexFile).

# COMMAND ----------

with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    found = store.query_by_key("events", "e-1234")
    for m in found:
        print(m.msg_id, m.queue_id, m.queue_offset, m.body)
check([m.body for m in found] == [b"event-1234"], f"by key e-1234: {found}")

# COMMAND ----------

# MAGIC %md Clean up: this run's store and checkpoints (a directory `_setup` made).

# COMMAND ----------

cleanup()
