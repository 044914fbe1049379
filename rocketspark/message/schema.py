"""The one row schema the data source reads and writes: :data:`ARROW_SCHEMA`.

Apart from ``message.arrow`` (the decoder that fills it) so that what only needs
the schema (the data source's planning process, ``client.api``) imports pyarrow
and nothing else: no numpy tables, no ``pyarrow.compute``.
"""

from __future__ import annotations

from functools import lru_cache

import pyarrow as pa

from rocketspark.errors import ConfigError

__all__ = ["ARROW_SCHEMA", "COLUMN_NAMES", "TIMESTAMP", "row_schema"]

TIMESTAMP = pa.timestamp("us", tz="UTC")

# Field names as the Spark data source exposes them; every field nullable.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("brokerName", pa.string()),
        pa.field("queueId", pa.int32()),
        pa.field("queueOffset", pa.int64()),
        pa.field("msgId", pa.string()),
        pa.field("uniqKey", pa.string()),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.list_(pa.string())),
        pa.field("body", pa.binary()),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
        pa.field("bornTimestamp", TIMESTAMP),
        pa.field("storeTimestamp", TIMESTAMP),
        pa.field("bornHost", pa.string()),
        pa.field("storeHost", pa.string()),
        pa.field("reconsumeTimes", pa.int32()),
        pa.field("commitLogOffset", pa.int64()),
        pa.field("flag", pa.int32()),
        pa.field("sysFlag", pa.int32()),
    ]
)

COLUMN_NAMES = tuple(ARROW_SCHEMA.names)


@lru_cache(maxsize=64)
def row_schema(columns: tuple[str, ...] | None = None) -> pa.Schema:
    """The row schema of ``columns`` (names of :data:`ARROW_SCHEMA`, in that order;
    None: all of it). Raises ConfigError for a name that is not a column."""
    if columns is None:
        return ARROW_SCHEMA
    unknown = [c for c in columns if c not in COLUMN_NAMES]
    if unknown:
        raise ConfigError(
            f"no column {unknown[0]!r} in the row schema (columns: {', '.join(COLUMN_NAMES)})"
        )
    return pa.schema([ARROW_SCHEMA.field(c) for c in columns])
