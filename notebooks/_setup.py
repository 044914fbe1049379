# Databricks notebook source
# MAGIC %md
# MAGIC Shared set-up, run by the other notebooks with `%run ./_setup`: a SparkSession
# MAGIC (the notebook's own on Databricks, a local one elsewhere) and a store directory.

# COMMAND ----------

import os
import tempfile

try:
    spark  # noqa: F821 - defined by Databricks
except NameError:
    from rocketspark.session import local_session

    spark = local_session("rocketspark-notebook")

try:
    display  # noqa: F821 - defined by Databricks
except NameError:
    def display(df, n=20):  # noqa: D103 - the local stand-in for Databricks' display
        df.show(n, truncate=60)

# The embedded store: a local directory (on Databricks, local disk of the driver, which
# local[*] style single-node clusters share with their executors).
# A fresh directory per run, so every notebook can be run again as it is. Checkpoints
# and tables go beside the store, not in it: a store directory holds only the store.
STORE = os.environ.get("ROCKETSPARK_STORE") or os.path.join(tempfile.mkdtemp(
    prefix="rocketspark-notebooks-", dir="/local_disk0/tmp" if os.path.isdir("/local_disk0")
    else None), "store")
WORK = os.path.normpath(STORE) + "-work"
os.makedirs(WORK, exist_ok=True)
# Short delay levels for demos and CI; RocketMQ's own are 1s 5s 10s 30s 1m ... 2h.
STORE_OPTIONS = {"messageDelayLevel": os.environ.get("ROCKETSPARK_DELAY_LEVELS",
                                                     " ".join(["1s"] * 18))}
print(f"store: {STORE}")
