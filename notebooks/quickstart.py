# Databricks notebook source
# MAGIC %md
# MAGIC # rocketspark quick start
# MAGIC Produce messages to an embedded RocketMQ store, read them as a stream, aggregate,
# MAGIC and write results back to a topic.

# COMMAND ----------

# MAGIC %run ./_setup

# COMMAND ----------

import os

if "STORE" not in globals():  # a plain Python run: the %run above is only a comment
    exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_setup.py")).read())

# COMMAND ----------

import json

from pyspark.sql import functions as F

from rocketspark.store import Message, MessageStore

with MessageStore.open(STORE, **STORE_OPTIONS) as store:
    store.create_topic("clicks", queues=4)
    store.create_topic("click-counts", queues=1)
    pages = ["home", "cart", "checkout", "search"]
    store.put_batch([Message("clicks", json.dumps({"user": i % 13, "page": pages[i % 4]}),
                             tags=pages[i % 4], keys=[f"u-{i % 13}"]) for i in range(2000)])

# COMMAND ----------

# MAGIC %md
# MAGIC Stream-read the topic (every message once), count clicks per page in each
# MAGIC micro-batch, and write the counts to `click-counts`, exactly once.

# COMMAND ----------

clicks = (spark.readStream.format("rocketmq").option("store", STORE).option("topic", "clicks")
          .option("startingOffsets", "earliest").option("group", "quickstart").load())
pages = clicks.select(F.get_json_object(F.col("body").cast("string"), "$.page").alias("page"))
out = pages.select(F.col("page").alias("tags"),
                   F.to_json(F.struct("page")).alias("body"))
query = (out.writeStream.format("rocketmq").option("store", STORE)
         .option("topic", "click-counts")
         .option("checkpointLocation", os.path.join(WORK, "quickstart-chk"))
         .trigger(availableNow=True).start())
finish(query, "counting clicks per page into click-counts")

# COMMAND ----------

counts = (spark.read.format("rocketmq").option("store", STORE).option("topic", "click-counts")
          .load().groupBy("tags").count().orderBy("tags"))
display(counts)
got = {r.tags: r["count"] for r in counts.collect()}
expected = {"cart": 500, "checkout": 500, "home": 500, "search": 500}
check(got == expected, f"click counts per page: expected {expected}, got {got}")

# COMMAND ----------

# MAGIC %md Clean up: this run's store and checkpoints (a directory `_setup` made).

# COMMAND ----------

cleanup()
