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
# Its files are sparse: a new store's apparent size is over 1 GB (`du -sh --apparent-size`),
# what it takes on disk a few MB. The last cell of each notebook removes the directory this
# cell made (never one $ROCKETSPARK_STORE names); a run that fails keeps it for a look.
RUN_DIR = None if os.environ.get("ROCKETSPARK_STORE") else tempfile.mkdtemp(
    prefix="rocketspark-notebooks-", dir="/local_disk0/tmp" if os.path.isdir("/local_disk0")
    else None)
STORE = os.environ.get("ROCKETSPARK_STORE") or os.path.join(RUN_DIR, "store")
WORK = os.path.normpath(STORE) + "-work"
os.makedirs(WORK, exist_ok=True)
# Short delay levels for demos and CI; RocketMQ's own are 1s 5s 10s 30s 1m ... 2h.
STORE_OPTIONS = {"messageDelayLevel": os.environ.get("ROCKETSPARK_DELAY_LEVELS",
                                                     " ".join(["1s"] * 18))}
print(f"store: {STORE}")

# COMMAND ----------

# Checks that say what went wrong: the state of a stream (a stream that failed or stopped
# is reported at once, with its own error), and what a cell expected against what it got.

import shutil
import time


class NotebookCheckFailed(AssertionError):
    """A check of this notebook failed; the message says which, and why."""

    def __init__(self, message):
        kept = f" (the store and checkpoints are kept in {RUN_DIR or WORK})"
        super().__init__(message + kept)


def check(condition, message):
    """Fail with ``message`` (what was expected, and what there is) unless ``condition``."""
    if not condition:
        raise NotebookCheckFailed(message)


def check_query(query, what):
    """Fail, naming ``what`` and the stream's own error, if the streaming query failed."""
    error = query.exception()
    if error is not None:
        raise NotebookCheckFailed(f"{what}: the stream failed: {error}") from error


def finish(query, what, timeout=600):
    """Wait for a query that ends by itself (availableNow); fail if it failed or runs on."""
    if not query.awaitTermination(timeout):
        query.stop()
        raise NotebookCheckFailed(f"{what}: the stream did not end within {timeout} s; "
                                  f"its last progress: {query.lastProgress}")
    check_query(query, what)


def wait_for(done, query, what, timeout, poll=0.25):
    """Call ``done()`` until it is true while ``query`` runs. Fails at once if the query
    stops (with its error), and after ``timeout`` s with its status and last progress."""
    deadline = time.time() + timeout
    while not done():
        if not query.isActive:
            check_query(query, what)
            raise NotebookCheckFailed(f"{what}: the stream stopped before it was done")
        if time.time() > deadline:
            raise NotebookCheckFailed(f"{what}: not done after {timeout} s; the stream's "
                                      f"status: {query.status}; its last progress: "
                                      f"{query.lastProgress}")
        time.sleep(poll)


def cleanup():
    """Remove this run's store and checkpoints, if this notebook made them."""
    if RUN_DIR is not None:
        shutil.rmtree(RUN_DIR)
        print(f"removed {RUN_DIR}")
