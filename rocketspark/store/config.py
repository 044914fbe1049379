"""Store configuration (``broker.conf``).

:class:`MessageStoreConfig` is the one place where every option lives: each
field carries RocketMQ's property name (``flushDiskType``), its default, its
type (``int``, ``bool``, ``str`` or a ``Literal`` of choices) and its bounds.
:meth:`MessageStoreConfig.load` reads a Java-properties ``broker.conf``, applies
keyword overrides (RocketMQ camelCase or snake_case), converts every value and
rejects unknown keys with a "did you mean".

The defaults are those of RocketMQ's ``MessageStoreConfig`` / ``BrokerConfig``
except where an embedded store on one machine wants something else; each such
field says so.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from rocketspark.errors import ConfigError

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_MESSAGE_DELAY_LEVEL",
    "BrokerRole",
    "FlushDiskType",
    "MessageStoreConfig",
]

FlushDiskType = Literal["ASYNC_FLUSH", "SYNC_FLUSH"]
# SLAVE is left out on purpose: an embedded store is always the master of its data.
BrokerRole = Literal["ASYNC_MASTER", "SYNC_MASTER"]

# Read by load() when no path is given and this file exists, relative to the
# current directory.
DEFAULT_CONFIG_FILE = os.path.join("conf", "broker.conf")
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1
_DELAY_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DELAY_ITEM = re.compile(r"(\d+)([smhd])")
_DELETE_WHEN = re.compile(r"\d{1,2}(;\d{1,2})*")
_INT = re.compile(r"[+-]?\d+")


def _parse_delay_levels(text: str) -> tuple[int, ...]:
    levels = []
    for item in text.split():
        m = _DELAY_ITEM.fullmatch(item)
        if m is None:
            raise ValueError(
                f"delay {item!r} is not a whole number followed by s, m, h or d (e.g. 10s, 2h)"
            )
        levels.append(int(m.group(1)) * _DELAY_UNIT_MS[m.group(2)])
    if not levels:
        raise ValueError("expected at least one delay level, got none")
    return tuple(levels)


def _check_delay_levels(value: str) -> None:
    _parse_delay_levels(value)


def _check_multiple_of_20(value: int) -> None:
    if value % 20:
        raise ValueError(f"must be a multiple of 20 (the ConsumeQueue entry size), got {value}")


def _check_ip(value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(
            f"expected an IPv4 or IPv6 address (it is written into every record as the "
            f"store host), got {value!r}"
        ) from None


def _check_delete_when(value: str) -> None:
    if not _DELETE_WHEN.fullmatch(value) or any(int(h) > 23 for h in value.split(";")):
        raise ValueError(f"expected hours of the day such as 04 or 04;16, got {value!r}")


def _check_not_blank(value: str) -> None:
    if not value.strip():
        raise ValueError("must not be empty")


def _option(
    key: str,
    default: Any,
    doc: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    check: Callable[[Any], None] | None = None,
) -> Any:
    """Declare one option: RocketMQ's property name, default, bounds, one line of doc."""
    return field(
        default=default,
        metadata={"key": key, "doc": doc, "minimum": minimum, "maximum": maximum, "check": check},
    )


@dataclass(frozen=True, slots=True)
class MessageStoreConfig:
    """The settings of one store: RocketMQ's MessageStoreConfig plus the broker settings it uses.

    Build it with :meth:`load`; constructing it directly validates the same way
    and raises ConfigError. Times are milliseconds unless a field says otherwise.

    Disk space (diskSpaceWarningLevelRatio and the two clean ratios) follows
    RocketMQ's defaults, with the differences the comment above those fields
    gives: the refusal threshold may be set up to 100 (a laptop's disk may be
    90% used with gigabytes free), and nothing is deleted automatically.
    """

    store_path_root_dir: str = _option(
        "storePathRootDir",
        "./store",
        "root directory of the store; a relative path resolves against the current "
        "directory of the process that opens the store (RocketMQ: ~/store)",
        check=_check_not_blank,
    )
    mapped_file_size_commit_log: int = _option(
        "mappedFileSizeCommitLog",
        1024 * 1024 * 1024,
        "size of one CommitLog segment in bytes (1 GiB)",
        minimum=4096,
        maximum=JAVA_INT_MAX,
    )
    mapped_file_size_consume_queue: int = _option(
        "mappedFileSizeConsumeQueue",
        300_000 * 20,
        "size of one ConsumeQueue file in bytes (300000 entries of 20 bytes)",
        minimum=20,
        maximum=JAVA_INT_MAX,
        check=_check_multiple_of_20,
    )
    max_hash_slot_num: int = _option(
        "maxHashSlotNum", 5_000_000, "hash slots per IndexFile", minimum=1, maximum=JAVA_INT_MAX
    )
    max_index_num: int = _option(
        "maxIndexNum",
        5_000_000 * 4,
        "index entries per IndexFile (entry 0 is never used, so at least 2)",
        minimum=2,
        maximum=JAVA_INT_MAX,
    )
    flush_disk_type: FlushDiskType = _option(
        "flushDiskType",
        "ASYNC_FLUSH",
        "ASYNC_FLUSH acknowledges puts in the page cache; SYNC_FLUSH forces them to disk first",
    )
    flush_interval_commit_log: int = _option(
        "flushIntervalCommitLog",
        500,
        "ASYNC_FLUSH: how often the flusher runs (ms)",
        minimum=1,
        maximum=JAVA_INT_MAX,
    )
    flush_commit_log_least_pages: int = _option(
        "flushCommitLogLeastPages",
        4,
        "ASYNC_FLUSH: dirty 4 KiB pages needed before a periodic flush",
        minimum=0,
        maximum=JAVA_INT_MAX,
    )
    flush_commit_log_thorough_interval: int = _option(
        "flushCommitLogThoroughInterval",
        10_000,
        "ASYNC_FLUSH: flush everything at least this often (ms)",
        minimum=0,
        maximum=JAVA_INT_MAX,
    )
    sync_flush_timeout: int = _option(
        "syncFlushTimeout",
        5_000,
        "SYNC_FLUSH: longest wait for the disk before FLUSH_DISK_TIMEOUT (ms)",
        minimum=1,
        maximum=JAVA_INT_MAX,
    )
    message_delay_level: str = _option(
        "messageDelayLevel",
        DEFAULT_MESSAGE_DELAY_LEVEL,
        "delay of levels 1, 2, ...: whole numbers with unit s, m, h or d",
        check=_check_delay_levels,
    )
    max_message_size: int = _option(
        "maxMessageSize",
        4 * 1024 * 1024,
        "largest message body in bytes (4 MiB)",
        minimum=1,
        maximum=JAVA_INT_MAX,
    )
    broker_cluster_name: str = _option(
        "brokerClusterName",
        "DefaultCluster",
        "cluster name (accepted so that a broker's broker.conf loads; the store does not use it)",
        check=_check_not_blank,
    )
    broker_name: str = _option(
        "brokerName",
        "broker-a",
        "broker name that queues are reported under",
        check=_check_not_blank,
    )
    broker_id: int = _option(
        "brokerId", 0, "broker id, 0 for a master (recorded only)", minimum=0, maximum=JAVA_LONG_MAX
    )
    broker_role: BrokerRole = _option(
        "brokerRole",
        "ASYNC_MASTER",
        "ASYNC_MASTER or SYNC_MASTER (the same here: an embedded store has no replicas)",
    )
    broker_ip1: str = _option(
        "brokerIP1",
        "127.0.0.1",
        "store host IP written into every record and msgId (RocketMQ: the first local address)",
        check=_check_ip,
    )
    listen_port: int = _option(
        "listenPort",
        10911,
        "store host port written into every record and msgId",
        minimum=0,
        maximum=65535,
    )
    default_topic_queue_nums: int = _option(
        "defaultTopicQueueNums",
        4,
        "queues of a topic created without a count (RocketMQ's BrokerConfig: 8)",
        minimum=1,
        maximum=JAVA_INT_MAX,
    )
    # RocketMQ defaults to true. In an embedded store a typo in a topic name would
    # silently create a new topic, so puts to an unknown topic fail instead.
    auto_create_topic_enable: bool = _option(
        "autoCreateTopicEnable",
        False,
        "create a topic on its first put (RocketMQ: true; off here so typos fail)",
    )
    # Not a broker.conf property in RocketMQ: there it is each subscription group's
    # retryMaxTimes (16), which this value seeds for groups the store creates.
    max_reconsume_times: int = _option(
        "maxReconsumeTimes",
        16,
        "retryMaxTimes of new consumer groups: deliveries before a message goes to %DLQ%",
        minimum=0,
        maximum=JAVA_INT_MAX,
    )
    transaction_timeout: int = _option(
        "transactionTimeOut",
        6_000,
        "age before an unresolved half message is checked (ms)",
        minimum=0,
        maximum=JAVA_LONG_MAX,
    )
    transaction_check_max: int = _option(
        "transactionCheckMax",
        15,
        "checks of a half message before it is discarded",
        minimum=0,
        maximum=JAVA_INT_MAX,
    )
    long_polling_enable: bool = _option(
        "longPollingEnable",
        True,
        "hold a pull that finds nothing until a message arrives or it times out",
    )
    # Not in RocketMQ, whose broker checks body CRCs only on recovery
    # (checkCRCOnRecover) and whose pulling client does not: here readers take the
    # bytes straight off the mapped files, so a body damaged on disk since it was
    # written would reach them unnoticed. On by default, as Kafka's check.crcs.
    check_crc_on_read: bool = _option(
        "checkCRCOnRead",
        True,
        "verify each body's CRC on pull, get_message, query_by_key and read_batches, "
        "raising CorruptRecordError on a mismatch; false returns bodies as stored",
    )
    file_reserved_time: int = _option(
        "fileReservedTime",
        72,
        "hours to keep a CommitLog segment before it may be deleted",
        minimum=0,
        maximum=JAVA_INT_MAX,
    )
    delete_when: str = _option(
        "deleteWhen",
        "04",
        "hours of the day when expired files are deleted, e.g. 04;16",
        check=_check_delete_when,
    )
    # RocketMQ's disk guard, as percentages of the store's file system used (df's
    # Use%). Its broker stops taking puts past diskSpaceWarningLevelRatio (90; it
    # caps the value at 90) and its clean service deletes expired files past
    # diskMaxUsedSpaceRatio (75), even unexpired ones past diskSpaceCleanForciblyRatio
    # (85). Here, with RocketMQ's defaults: puts are refused with DiskFullError past
    # diskSpaceWarningLevelRatio, and also whenever the blocks a put writes cannot
    # be reserved (fallocate, a chunk ahead). The value may go up to 100 (RocketMQ:
    # at most 90), for a laptop whose disk is 90% used with space to spare: 100
    # leaves only the reservation check. An embedded store has no clean service, so the
    # two clean thresholds only log a warning (once per crossing) that expired
    # files should be deleted (``rocketspark store clean``).
    disk_space_warning_level_ratio: int = _option(
        "diskSpaceWarningLevelRatio",
        90,
        "refuse puts (DiskFullError) while the store's disk is used past this percentage; "
        "100: only when a put's blocks cannot be reserved (RocketMQ caps it at 90)",
        minimum=1,
        maximum=100,
    )
    disk_space_clean_forcibly_ratio: int = _option(
        "diskSpaceCleanForciblyRatio",
        85,
        "warn that expired files should be deleted past this disk usage percentage "
        "(RocketMQ deletes them then; nothing here deletes by itself)",
        minimum=1,
        maximum=100,
    )
    disk_max_used_space_ratio: int = _option(
        "diskMaxUsedSpaceRatio",
        75,
        "warn that expired files should be deleted past this disk usage percentage "
        "(RocketMQ's clean threshold; nothing here deletes by itself)",
        minimum=1,
        maximum=100,
    )

    def __post_init__(self) -> None:
        for opt in _OPTIONS:
            try:
                opt.check(getattr(self, opt.field))
            except ValueError as exc:
                raise ConfigError(f"{opt.key}: {exc}") from None

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, /, **overrides: Any
    ) -> MessageStoreConfig:
        """Read a ``broker.conf``, apply ``overrides`` on top, and validate everything.

        ``path`` defaults to ``conf/broker.conf`` under the current directory
        when that file exists, else built-in defaults only. The file uses
        RocketMQ's camelCase names; overrides may use camelCase
        (``flushDiskType="SYNC_FLUSH"``) or snake_case (``flush_disk_type=...``),
        as Python values or as strings, which are parsed like the file's.
        Raises ConfigError naming the key and where it came from (``file:line``
        or the keyword) for an unknown key, with a "did you mean", and for a bad
        value.
        """
        values: dict[str, Any] = {}
        if path is None and os.path.isfile(DEFAULT_CONFIG_FILE):
            path = DEFAULT_CONFIG_FILE
        if path is not None:
            source = os.fspath(path)
            for lineno, key, raw in read_properties(source):
                where = f"{source}:{lineno}"
                opt = _lookup(key, where, allow_snake_case=False)
                values[opt.field] = opt.parse(raw, where)
        given: dict[str, str] = {}
        for key, value in overrides.items():
            where = f"keyword argument {key}"
            opt = _lookup(key, where, allow_snake_case=True)
            if opt.field in given:
                raise ConfigError(f"{opt.key} is given twice, as {given[opt.field]} and as {key}")
            given[opt.field] = key
            if isinstance(value, str):
                values[opt.field] = opt.parse(value, where)
            elif opt.kind is str and isinstance(value, os.PathLike):
                values[opt.field] = opt.parse(os.fspath(value), where)
            else:
                values[opt.field] = opt.check_at(value, where)
        return cls(**values)

    def delay_levels_ms(self) -> tuple[int, ...]:
        """Return messageDelayLevel in milliseconds: element 0 is level 1.

        Raises ConfigError naming messageDelayLevel when the value does not parse.
        """
        try:
            return _parse_delay_levels(self.message_delay_level)
        except ValueError as exc:
            raise ConfigError(f"messageDelayLevel: {exc}") from None

    def to_properties(self, *, comments: bool = True) -> str:
        """Render as ``broker.conf`` text with RocketMQ's names; :meth:`load` reads it back."""
        lines = []
        for opt in _OPTIONS:
            if comments:
                lines.append(f"# {opt.doc}")
            lines.append(f"{opt.key}={_escape_property(opt.render(getattr(self, opt.field)))}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class _Option:
    key: str  # RocketMQ's camelCase property name
    field: str  # our snake_case field name
    kind: type  # int, bool or str
    choices: tuple[str, ...]
    minimum: int | None
    maximum: int | None
    extra_check: Callable[[Any], None] | None
    doc: str

    def parse(self, raw: str, where: str) -> Any:
        """Convert the text of a property (or a string override) and check it."""
        text = raw.strip()
        if self.kind is bool:
            if text.lower() not in ("true", "false"):
                raise ConfigError(f"{where}: {self.key}: expected true or false, got {raw!r}")
            return text.lower() == "true"
        if self.kind is int:
            if not _INT.fullmatch(text):
                raise ConfigError(f"{where}: {self.key}: expected an integer, got {raw!r}")
            return self.check_at(int(text), where)
        return self.check_at(text, where)

    def check_at(self, value: Any, where: str) -> Any:
        try:
            return self.check(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {self.key}: {exc}") from None

    def check(self, value: Any) -> Any:
        """Return ``value`` if it is of the right type and in range, else raise ValueError."""
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {value!r}")
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"must be at least {self.minimum}, got {value}")
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"must be at most {self.maximum}, got {value}")
        elif self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {value!r}")
        elif not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}, got {value!r}")
        if self.extra_check is not None:
            self.extra_check(value)
        return value

    def render(self, value: Any) -> str:
        return ("true" if value else "false") if self.kind is bool else str(value)


def _build_options() -> tuple[_Option, ...]:
    hints = typing.get_type_hints(MessageStoreConfig)
    options = []
    for f in dataclasses.fields(MessageStoreConfig):
        hint = hints[f.name]
        choices: tuple[str, ...] = ()
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            hint = str
        options.append(
            _Option(
                key=f.metadata["key"],
                field=f.name,
                kind=hint,
                choices=choices,
                minimum=f.metadata["minimum"],
                maximum=f.metadata["maximum"],
                extra_check=f.metadata["check"],
                doc=f.metadata["doc"],
            )
        )
    return tuple(options)


_OPTIONS = _build_options()
_BY_KEY = {opt.key: opt for opt in _OPTIONS}
_BY_FIELD = {opt.field: opt for opt in _OPTIONS}


def _normalised(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


_BY_NORMALISED = {_normalised(opt.key): opt for opt in _OPTIONS}


def canonical_key(key: str) -> str | None:
    """Return the broker.conf key that ``key`` names in any case or spelling, or None.

    Spark lower-cases option names (``rocketmq.flushdisktype``); this finds
    ``flushDiskType`` again.
    """
    opt = _BY_NORMALISED.get(_normalised(key))
    return opt.key if opt is not None else None


def open_config(
    path: str | os.PathLike[str] | None, config_file: str | None, overrides: dict[str, object]
) -> tuple[MessageStoreConfig, dict[str, str]]:
    """Return the config ``MessageStore.open`` opens with, and the keys set on purpose.

    ``overrides`` go on top of ``config_file`` (see :meth:`MessageStoreConfig.load`);
    ``path``, when given, is the storePathRootDir (ConfigError if an override names it
    too). The second value maps each override's broker.conf key to where it was set.
    """
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"the store path must be a str or os.PathLike, got {path!r}")
        for key in overrides:
            if canonical_key(key) == "storePathRootDir":
                raise ConfigError(f"the store path is given twice, as path and as {key}")
        overrides = {**overrides, "store_path_root_dir": os.fspath(path)}
    config = MessageStoreConfig.load(config_file, **overrides)
    explicit = {canonical_key(key) or key: f"keyword argument {key}" for key in overrides}
    return config, explicit


def _lookup(key: str, where: str, *, allow_snake_case: bool) -> _Option:
    """Return the option named ``key``; raise ConfigError with a suggestion if there is none."""
    opt = _BY_KEY.get(key)
    if opt is None and allow_snake_case:
        opt = _BY_FIELD.get(key)
    if opt is not None:
        return opt
    # Suggest in the style the caller used: snake_case only where it is allowed.
    snake = allow_snake_case and ("_" in key or key.islower())
    close = _BY_NORMALISED.get(_normalised(key))
    if close is None:
        matches = difflib.get_close_matches(
            _normalised(key), list(_BY_NORMALISED), n=1, cutoff=0.75
        )
        close = _BY_NORMALISED[matches[0]] if matches else None
    hint = ""
    if close is not None:
        hint = f"; did you mean {(close.field if snake else close.key)!r}?"
    raise ConfigError(f"{where}: unknown store configuration key {key!r}{hint}")


# --- Java properties files ---------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _unescape(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 == len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _escape_property(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield (first line number, logical line) per java.util.Properties.load.

    Blank and comment (``#``, ``!``) lines are skipped; a line that ends in an
    odd number of backslashes continues on the next one, whose leading blanks
    are dropped.
    """
    lines = _LINE_BREAK.split(text)  # not str.splitlines(): Java breaks lines at \n and \r only
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            line = line[:-1]
            if i >= len(lines):
                break
            line += lines[i].lstrip(" \t\f")
            i += 1
        yield lineno, line


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=: \t\f":
            break
        i += 1
    # The key ends at the first unescaped "=", ":" or blank; blanks, then at most
    # one "=" or ":", then blanks separate it from the value.
    rest = line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:]
    return _unescape(line[:i]), _unescape(rest.lstrip(" \t\f"))


def read_properties(path: str) -> list[tuple[int, str, str]]:
    """Return (line number, key, raw value) of each property in ``path``, in file order."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read store configuration {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return [(lineno, *_split_property(line)) for lineno, line in _logical_lines(text)]
