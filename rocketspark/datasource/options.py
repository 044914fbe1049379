"""Every option of the "rocketmq" data source: its key, default and parser, in one place.

Keys are matched case-insensitively (Spark hands options over that way). An
unknown key is an error with a "did you mean" (a typo like ``maxOffsetPerTrigger``
would otherwise be silently ignored and the query would read without a limit).
Keys that start with ``rocketmq.`` are passed to the embedded store as broker.conf
overrides (``rocketmq.flushDiskType=SYNC_FLUSH``), as ``kafka.*`` options are passed
to Kafka's client.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rocketspark.client import ClientRef, SubscriptionExpression, canonical_key
from rocketspark.errors import ConfigError

STORE_OPTION_PREFIX = "rocketmq."

# Spark adds these to every data source's options; they are not ours to check.
_SPARK_OWNED = frozenset({"path", "checkpointlocation", "queryname", "__spark_internal"})


def _text(key: str, value: str) -> str:
    return value


def _int_option(minimum: int, expected: str, must: str) -> Callable[[str, str], int]:
    """A parser of integers >= ``minimum``, with the option's own wording for errors."""

    def parse(key: str, value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"option {key}: expected {expected}, got {value!r}") from None
        if n < minimum:
            raise ConfigError(f"option {key}: must be {must}, got {value!r}")
        return n

    return parse


_positive_int = _int_option(1, "a positive integer", "a positive integer")
_non_negative_int = _int_option(0, "an integer >= 0", ">= 0")
_timestamp_ms = _int_option(0, "milliseconds since the epoch", ">= 0")


def _bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {key}: expected true or false, got {value!r}")


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
# A bare number is milliseconds, as Spark's Kafka connector reads maxTriggerDelay.
_UNIT_MS = {
    None: 1,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def _duration_ms(key: str, value: str) -> int:
    m = _DURATION.match(value)
    if not m:
        raise ConfigError(
            f"option {key}: expected a duration such as 500ms, 30s, 15m or 1h, got {value!r}"
        )
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower() if m.group(2) else None]


def _sub_expression(key: str, value: str) -> str:
    """A tag expression, checked as the store reads it (``*``, or ``TagA || TagB``)."""
    try:
        SubscriptionExpression(value)
    except ConfigError as e:
        raise ConfigError(f"option {key}: {e}") from None
    return value


def _topics(key: str, value: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in value.split(",") if t.strip())
    if not names:
        raise ConfigError(f"option {key}: no topic named in {value!r}")
    return names


def _pattern(key: str, value: str) -> re.Pattern[str]:
    try:
        return re.compile(value)
    except re.error as e:
        raise ConfigError(f"option {key}: {value!r} is not a regular expression: {e}") from None


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(key: str, value: str) -> str:
        v = value.strip().lower()
        if v not in allowed:
            raise ConfigError(f"option {key}: expected one of {', '.join(allowed)}, got {value!r}")
        return v

    return parse


def _offsets_spec(key: str, value: str) -> str | dict[str, dict[str, dict[str, int]]]:
    """earliest | latest | group | a JSON object {"topic": {"broker": {"queueId": offset}}}."""
    v = value.strip()
    if v.lower() in ("earliest", "latest", "group"):
        return v.lower()
    parsed = _json(
        key,
        v,
        'earliest, latest, group or a JSON object such as {"orders": {"broker-a": {"0": 42}}}',
    )
    return _check_offsets_json(key, parsed)


def _json(key: str, value: str, expected: str) -> Any:
    """The JSON an option holds; a ConfigError naming the option and what it expects."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"option {key}: expected {expected}, got {value!r} ({e.msg} at column {e.colno})"
        ) from None


def _check_offsets_json(key: str, parsed: Any) -> dict[str, dict[str, dict[str, int]]]:
    where = f"option {key}"
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(
            f"{where}: expected a non-empty JSON object "
            f'{{"topic": {{"brokerName": {{"queueId": offset}}}}}}'
        )
    out: dict[str, dict[str, dict[str, int]]] = {}
    for topic, brokers in parsed.items():
        if not isinstance(brokers, dict):
            raise ConfigError(
                f"{where}: topic {topic!r} must map broker names to queues, got {brokers!r}"
            )
        out[topic] = {}
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise ConfigError(
                    f"{where}: {topic}/{broker} must map queue ids to offsets, got {queues!r}"
                )
            out[topic][broker] = {}
            for qid, off in queues.items():
                if not str(qid).isdigit():
                    raise ConfigError(
                        f"{where}: queue id {qid!r} of {topic}/{broker} is not a "
                        "non-negative integer"
                    )
                if isinstance(off, bool) or not isinstance(off, int) or off < -2:
                    raise ConfigError(
                        f"{where}: offset {off!r} of {topic}/{broker}/{qid} must "
                        "be an integer >= 0, or -2 (earliest) / -1 (latest)"
                    )
                out[topic][broker][str(int(qid))] = off
    return out


def _ending_spec(key: str, value: str) -> str | dict[str, dict[str, dict[str, int]]]:
    spec = _offsets_spec(key, value)
    if spec in ("earliest", "group"):
        raise ConfigError(f"option {key}: must be latest or a JSON object, got {value!r}")
    if isinstance(spec, dict) and any(
        o == -2 for b in spec.values() for q in b.values() for o in q.values()
    ):
        raise ConfigError(f"option {key}: -2 (earliest) is not allowed as an ending offset")
    return spec


def _timestamps_spec(key: str, value: str) -> dict[str, dict[str, dict[str, int]]]:
    """A JSON object {"topic": {"broker": {"queueId": timestamp ms}}} (Kafka's
    startingOffsetsByTimestamp, with RocketMQ's broker level)."""
    parsed = _json(
        key, value, 'a JSON object such as {"orders": {"broker-a": {"0": 1700000000000}}}'
    )
    spec = _check_offsets_json(key, parsed)
    for topic, brokers in spec.items():
        for broker, queues in brokers.items():
            for qid, ts in queues.items():
                if ts < 0:
                    raise ConfigError(
                        f"option {key}: timestamp {ts} of {topic}/{broker}/{qid} "
                        "must be >= 0 (milliseconds since the epoch)"
                    )
    return spec


def _assign(key: str, value: str) -> dict[str, tuple[str | None, tuple[int, ...]]]:
    """Kafka's assign: {"topic": [queueId, ...]}, or {"topic": {"brokerName": [queueId, ...]}}."""
    example = '{"orders": [0, 1]} or {"orders": {"broker-a": [0, 1]}}'
    parsed = _json(key, value, f"a JSON object such as {example}")
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"option {key}: expected a non-empty JSON object such as {example}")
    out: dict[str, tuple[str | None, tuple[int, ...]]] = {}
    for topic, queues in parsed.items():
        broker = None
        if isinstance(queues, dict):
            if len(queues) != 1:
                raise ConfigError(
                    f"option {key}: topic {topic!r} must name one broker (the "
                    f"store's), got {sorted(queues)}"
                )
            ((broker, queues),) = queues.items()
        if (
            not isinstance(queues, list)
            or not queues
            or not all(isinstance(q, int) and not isinstance(q, bool) and q >= 0 for q in queues)
        ):
            raise ConfigError(
                f"option {key}: topic {topic!r} must list queue ids (integers "
                f">= 0), got {queues!r}; e.g. {example}"
            )
        out[topic] = (broker, tuple(sorted(set(queues))))
    return out


@dataclass(frozen=True)
class Option:
    key: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    roles: frozenset[str] = field(default_factory=lambda: frozenset({"read", "write"}))


_R = frozenset({"read"})
_W = frozenset({"write"})
_RW = frozenset({"read", "write"})

OPTIONS: dict[str, Option] = {
    o.key.lower(): o
    for o in [
        Option(
            "store",
            _text,
            None,
            "embedded store directory (default: storePathRootDir of conf/broker.conf)",
            _RW,
        ),
        Option(
            "nameServer",
            _text,
            None,
            "NameServers of a RocketMQ cluster, host:port;host:port (instead of store)",
            _RW,
        ),
        Option("accessKey", _text, None, "ACL access key (default: $ROCKETMQ_ACCESS_KEY)", _RW),
        Option("secretKey", _text, None, "ACL secret key (default: $ROCKETMQ_SECRET_KEY)", _RW),
        Option("timeoutMs", _positive_int, None, "cluster: a request's answer (10000)", _RW),
        Option("connectTimeoutMs", _positive_int, None, "cluster: making a connection (3000)", _RW),
        Option(
            "pullBatchSize", _positive_int, None, "cluster: messages asked for per pull (32)", _R
        ),
        Option("pullPipeline", _positive_int, None, "cluster: pulls in flight per queue (8)", _R),
        Option(
            "brokerName", _text, None, "broker name in offsets and rows (default: the store's)", _R
        ),
        Option(
            "topic",
            _topics,
            None,
            "comma-separated topics to read; the default topic to write",
            _RW,
        ),
        Option("topicPattern", _pattern, None, "regular expression over topic names (read)", _R),
        Option(
            "assign",
            _assign,
            None,
            'the queues to read, as JSON: {"topic": [queueId, ...]} (read)',
            _R,
        ),
        Option("subExpression", _sub_expression, "*", "tag expression: * or TagA || TagB", _R),
        Option(
            "group", _text, None, "consumer group: Spark's progress is committed as its offsets", _R
        ),
        Option(
            "startingOffsets",
            _offsets_spec,
            None,
            "earliest | latest | group | JSON (default: latest for streams, earliest for batch)",
            _R,
        ),
        Option(
            "startingTimestamp",
            _timestamp_ms,
            None,
            "start every queue at its first message stored at or after this time (ms)",
            _R,
        ),
        Option(
            "startingOffsetsByTimestamp",
            _timestamps_spec,
            None,
            'per queue, as startingTimestamp: {"topic": {"broker": {"queueId": ms}}}',
            _R,
        ),
        Option(
            "startingOffsetsByTimestampStrategy",
            _choice("latest", "error"),
            "latest",
            "a queue with no message at or after the starting timestamp: start at its end "
            "(latest) or fail (error)",
            _R,
        ),
        Option("endingOffsets", _ending_spec, "latest", "latest | JSON (batch reads)", _R),
        Option(
            "endingTimestamp",
            _timestamp_ms,
            None,
            "end every queue before its first message stored at or after this time (batch)",
            _R,
        ),
        Option(
            "endingOffsetsByTimestamp",
            _timestamps_spec,
            None,
            'per queue, as endingTimestamp: {"topic": {"broker": {"queueId": ms}}} (batch)',
            _R,
        ),
        Option(
            "maxOffsetsPerTrigger",
            _positive_int,
            None,
            "at most this many offsets per micro-batch, over all queues",
            _R,
        ),
        Option(
            "minOffsetsPerTrigger",
            _positive_int,
            None,
            "wait for at least this many new offsets (up to maxTriggerDelay)",
            _R,
        ),
        Option(
            "maxTriggerDelay",
            _duration_ms,
            15 * 60_000,
            "longest wait for minOffsetsPerTrigger (default 15m)",
            _R,
        ),
        Option(
            "minPartitions",
            _positive_int,
            None,
            "split queue ranges so that a batch has at least this many partitions",
            _R,
        ),
        Option(
            "maxRecordsPerPartition",
            _positive_int,
            None,
            "split queue ranges larger than this into several partitions",
            _R,
        ),
        Option(
            "failOnDataLoss",
            _bool,
            True,
            "fail when requested offsets are gone (segments deleted); false skips ahead",
            _R,
        ),
        Option(
            "checkCRCs",
            _bool,
            None,
            "verify each body against its CRC as it is read, failing on a damaged one "
            "(default: the store's checkCRCOnRead, true); false reads bodies as stored, "
            "as Kafka's check.crcs=false",
            _R,
        ),
        Option(
            "deliveryGuarantee",
            _choice("exactly_once", "at_least_once"),
            "exactly_once",
            "exactly_once (transactional half messages) or at_least_once",
            _W,
        ),
        Option("producerGroup", _text, None, "producer group of the sink's transactions", _W),
        Option(
            "txnAppId",
            _text,
            None,
            "with txnVersion: an idempotent batch write (e.g. in foreachBatch), as Delta's; "
            "versions are counted per txnAppId and topic option",
            _W,
        ),
        Option(
            "txnVersion",
            _non_negative_int,
            None,
            "with txnAppId: a version written before is not written again",
            _W,
        ),
        Option(
            "sinkId",
            _text,
            None,
            "identity of an exactly-once sink across restarts (default: the checkpoint location)",
            _W,
        ),
    ]
}


@dataclass(frozen=True)
class ParsedOptions:
    """Options after parsing: ``values`` by canonical key, ``store`` overrides."""

    values: Mapping[str, Any]
    store_overrides: Mapping[str, str]
    raw: Mapping[str, str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        v = self.values.get(key)
        return default if v is None else v


def parse_options(options: Mapping[str, str], role: Literal["read", "write"]) -> ParsedOptions:
    """Check every key and value; raise ConfigError naming the first bad option."""
    values: dict[str, Any] = {o.key: o.default for o in OPTIONS.values() if role in o.roles}
    overrides: dict[str, str] = {}
    store_keys: dict[str, str] = {}  # broker.conf key -> the option that gave it
    raw: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in _SPARK_OWNED:
            raw[lower] = value
            continue
        if lower.startswith(STORE_OPTION_PREFIX):
            name = key[len(STORE_OPTION_PREFIX) :]
            canonical = canonical_key(name) or name  # Spark lower-cases keys
            if canonical in overrides:
                raise ConfigError(
                    f"option {STORE_OPTION_PREFIX}{canonical} is given twice "
                    f"(as {store_keys[canonical]!r} and as {key!r})"
                )
            overrides[canonical] = value
            store_keys[canonical] = key
            continue
        opt = OPTIONS.get(lower)
        if opt is None or role not in opt.roles:
            known = [o.key for o in OPTIONS.values() if role in o.roles]
            close = difflib.get_close_matches(lower, [k.lower() for k in known], n=1, cutoff=0.7)
            hint = ""
            if close:
                hint = f"; did you mean {next(k for k in known if k.lower() == close[0])!r}?"
            elif opt is not None:
                hint = f" (it is a {'sink' if 'write' in opt.roles else 'source'} option)"
            end = "" if hint.endswith("?") else "."
            raise ConfigError(
                f"unknown rocketmq {'source' if role == 'read' else 'sink'} option {key!r}"
                f"{hint}{end} Known options: {', '.join(sorted(known))}, and "
                "rocketmq.<broker.conf key> for the store"
            )
        values[opt.key] = opt.parse(opt.key, str(value))
        raw[opt.key] = "(secret)" if opt.key in SECRET_OPTIONS else value
    if values.get("store") is not None and "storePathRootDir" in overrides:
        raise ConfigError(
            f"options store and {store_keys['storePathRootDir']} both name the store "
            "directory; give only one of them"
        )
    return ParsedOptions(values, overrides, raw)


# The options a cluster reference carries as the remote client's settings.
CLUSTER_SETTINGS = ("timeoutMs", "connectTimeoutMs", "pullBatchSize", "pullPipeline")
# Options whose values are never shown (errors, logs, the parsed options' raw values).
SECRET_OPTIONS = frozenset({"secretKey"})


def client_ref(options: ParsedOptions) -> ClientRef:
    """The endpoint the options name: an embedded store (``store``, the default) or a
    cluster (``nameServer``); ConfigError naming the options that conflict."""
    namesrv = options.get("nameServer")
    if namesrv is None:
        given = [k for k in ("accessKey", "secretKey", *CLUSTER_SETTINGS) if k in options.raw]
        if given:
            raise ConfigError(f"option {given[0]} applies to a cluster: give nameServer too")
        return ClientRef.embedded(options.get("store"), options.store_overrides)
    for key in ("store", "brokerName"):
        if options.get(key) is not None:
            raise ConfigError(
                f"options nameServer and {key} exclude each other: nameServer reads a "
                "cluster (whose brokers name themselves), store an embedded store"
            )
    if options.store_overrides:
        key = next(iter(options.store_overrides))
        raise ConfigError(
            f"option {STORE_OPTION_PREFIX}{key} sets an embedded store; a cluster's brokers "
            "keep their own broker.conf"
        )
    settings = {k: str(options[k]) for k in CLUSTER_SETTINGS if options.get(k) is not None}
    group = options.get("group")
    if group:
        settings["consumerGroup"] = group
    return ClientRef.cluster(
        namesrv,
        settings,
        access_key=options.get("accessKey"),
        secret_key=options.get("secretKey"),
    )


def describe() -> str:
    """Return a table of every option for documentation."""
    rows = [f"{o.key:24} {','.join(sorted(o.roles)):10} {o.doc}" for o in OPTIONS.values()]
    return "\n".join(rows)
