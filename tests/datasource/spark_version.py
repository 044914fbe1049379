"""What the running Spark offers Python data sources (tests assert each version's behaviour).

Spark 4.2 added admission control (maxOffsetsPerTrigger / minOffsetsPerTrigger) and
Trigger.AvailableNow for Python streaming sources; Spark 4.1 filter pushdown for
batch reads. On older versions the connector runs without them, as documented in
the README; `./dev test-compat 4.0|4.1` runs the data source tests there.
"""

from __future__ import annotations

import pyspark

SPARK = tuple(int(x) for x in pyspark.__version__.split(".")[:2])
ADMISSION_CONTROL = SPARK >= (4, 2)
FILTER_PUSHDOWN = SPARK >= (4, 1)
