"""A local SparkSession set up for rocketspark: Python workers, Arrow, and Delta when present.

On Databricks use the ``spark`` the notebook gives you: it has Delta built in
and the data source registers itself. Locally::

    from rocketspark.session import local_session
    spark = local_session()          # local[2], Delta configured if its jars are found

Delta's jars are looked up in ``$ROCKETSPARK_JARS`` (``./dev`` fetches them with
Maven into ``.jars/``); without them, ``delta=True`` falls back to delta-spark's
``configure_spark_with_delta_pip``, which has Spark resolve them from Maven
Central at start-up.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def jars_dir() -> str | None:
    """Return the directory of fetched JVM jars, if there is one."""
    here = os.environ.get("ROCKETSPARK_JARS")
    if here and os.path.isdir(here):
        return here
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jars")
    return checkout if os.path.isdir(checkout) else None


def local_session(
    app_name: str = "rocketspark",
    *,
    master: str = "local[2]",
    delta: bool = True,
    conf: dict[str, str] | None = None,
) -> Any:
    """Return a SparkSession for local runs (created, or the active one with our settings)."""
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (the one rocketspark is installed in).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    if master.startswith("local"):
        # A local session serves no other machine: its driver listens on loopback only
        # (Spark would bind the host's address); ``conf`` may say otherwise.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    for key, value in spark_defaults().items():
        if delta or not key.startswith(("spark.sql.extensions", "spark.sql.catalog.")):
            builder = builder.config(key, value)
    log4j = _log4j_config()
    if log4j:
        opt = f"-Dlog4j.configurationFile=file:{log4j}"
        builder = builder.config("spark.driver.extraJavaOptions", opt)
    if delta:
        jars = sorted(glob.glob(os.path.join(jars_dir() or "/nonexistent", "*.jar")))
        builder = builder.config("spark.sql.extensions", DELTA_EXTENSION).config(
            "spark.sql.catalog.spark_catalog", DELTA_CATALOG
        )
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        else:
            from delta import configure_spark_with_delta_pip

            builder = configure_spark_with_delta_pip(builder)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _log4j_config() -> str | None:
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "log4j2.properties"
    )
    return path if os.path.isfile(path) else None


# Used when conf/spark-defaults.conf is not around (an installed wheel).
BUILT_IN_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.sql.execution.pyspark.udf.hideTraceback.enabled": "true",
}


def spark_defaults() -> dict[str, str]:
    """Return the settings of conf/spark-defaults.conf (``key value`` lines, # comments)."""
    path = os.environ.get("ROCKETSPARK_SPARK_DEFAULTS") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "spark-defaults.conf"
    )
    if not os.path.isfile(path):
        return dict(BUILT_IN_DEFAULTS)
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition(" ")
            out[key.strip()] = value.strip()
    return out
