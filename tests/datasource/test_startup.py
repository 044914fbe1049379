"""What the data source imports where a query waits for it.

Spark starts a Python process of its own for every streaming query, which plans
the query's batches (``schema``, ``streamReader``, ``initialOffset``,
``latestOffset``, ``partitions``, ``commit``): the query's first trigger waits
for what that process imports. And Spark imports every top-level ``pyspark_*``
module at the first ``load()`` of a session, whatever the format. Each test runs
the code in a fresh interpreter that has imported what Spark's own worker
module imports, and looks at what our code added.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

from pyspark.sql.datasource import CaseInsensitiveDict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Never needed to plan a stream of an embedded store: the sink and its ledger, the
# command line, dead letters, Delta, a cluster's client, pandas, and the decoder
# (planning needs the row schema only: ``message.schema``).
NOT_FOR_PLANNING = (
    "rocketspark.datasource.sink",
    "rocketspark.datasource.ledger",
    "rocketspark.cli",
    "rocketspark.cli_cluster",
    "rocketspark.demo",
    "rocketspark.deadletter",
    "rocketspark.session",
    "rocketspark.client.remote",
    "rocketspark.remoting",
    "rocketspark.message.arrow",
    "pyarrow.compute",
    "delta",
    "pandas",
)

_PLAN = """
import json, pickle, sys
import pyspark.sql.streaming.python_streaming_source_runner  # Spark's runner, as it starts
from pyspark.sql.datasource_internal import _streamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import _parse_datatype_json_string

before = set(sys.modules)
with open(sys.argv[1], "rb") as f:
    source, schema = pickle.load(f)
reader = _streamReader(pickle.loads(source), _parse_datatype_json_string(schema))
reader.prepareForTriggerAvailableNow()
reader.getDefaultReadLimit()
start = reader.initialOffset()
end = reader.latestOffset(start, ReadAllAvailable())
parts = reader.partitions(start, end)
reader.commit(end)
print(json.dumps({"partitions": len(parts), "new": sorted(set(sys.modules) - before)}))
"""

_LOOKUP = """
import json, sys
import pyspark.sql.worker.lookup_data_sources  # Spark's lookup of pyspark_* modules

before = set(sys.modules)
import pyspark_rocketmq
print(json.dumps({"new": sorted(set(sys.modules) - before)}))
"""


def _run(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


def test_the_lookup_of_pyspark_modules_imports_the_data_source_class_only() -> None:
    new = _run(_LOOKUP)["new"]
    assert sorted(m for m in new if m.startswith("rocketspark")) == [
        "rocketspark",
        "rocketspark.datasource",
        "rocketspark.errors",
    ]
    assert _loaded(new, ("numpy", "pyarrow", *NOT_FOR_PLANNING)) == []


def test_planning_a_stream_imports_nothing_of_the_sink_cli_or_delta(store_path, tmp_path) -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    from rocketspark.client import ARROW_SCHEMA
    from rocketspark.datasource import RocketMQDataSource
    from rocketspark.store import Message, MessageStore

    with MessageStore.open(store_path) as s:
        s.create_topic("T", queues=4)
        for i in range(8):
            s.put(Message("T", b"x", queue_id=i % 4))
    options = CaseInsensitiveDict(store=store_path, topic="T", startingOffsets="earliest")
    blob = tmp_path / "source.pickle"
    blob.write_bytes(
        pickle.dumps(
            (pickle.dumps(RocketMQDataSource(options)), from_arrow_schema(ARROW_SCHEMA).json())
        )
    )
    got = _run(_PLAN, str(blob))
    assert got["partitions"] == 4  # the planning ran
    assert _loaded(got["new"], NOT_FOR_PLANNING) == []
