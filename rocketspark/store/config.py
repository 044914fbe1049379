"""Store configuration: ``broker.conf`` with RocketMQ's property names, typed.

Every key lives in ``_KEYS`` with its RocketMQ name, its type and its default.
:meth:`MessageStoreConfig.load` reads a Java-properties file, applies keyword
overrides (camelCase or snake_case), converts and validates each value, and
rejects unknown keys with a "did you mean".

Also here: topic and group name validation (TopicValidator's rules), which is
what keeps every name inside the store directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass
from typing import Any, Literal

from rocketspark.errors import ConfigError, InvalidNameError

FlushDiskType = Literal["ASYNC_FLUSH", "SYNC_FLUSH"]
DEFAULT_CONFIG_FILE = os.path.join("conf", "broker.conf")
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


@dataclass(frozen=True)
class MessageStoreConfig:
    """The settings of one store (RocketMQ's MessageStoreConfig + the broker's bits we use)."""

    store_path_root_dir: str = "./store"
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    flush_disk_type: FlushDiskType = "ASYNC_FLUSH"
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    sync_flush_timeout: int = 5_000
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    max_message_size: int = 4 * 1024 * 1024
    broker_name: str = "broker-a"
    broker_ip1: str = "127.0.0.1"
    listen_port: int = 10911
    default_topic_queue_nums: int = 4
    # An embedded store that creates topics on first put hides typos; off by default.
    auto_create_topic_enable: bool = False
    max_reconsume_times: int = 16
    transaction_timeout: int = 6_000
    transaction_check_max: int = 15
    long_polling_enable: bool = True
    file_reserved_time: int = 72

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            spec = _BY_FIELD[f.name]
            value = getattr(self, f.name)
            spec.check(value, "")
        if self.mapped_file_size_consume_queue % 20:
            raise ConfigError(
                f"mappedFileSizeConsumeQueue must be a multiple of 20, got "
                f"{self.mapped_file_size_consume_queue}")
        if self.max_message_size + 1024 > self.mapped_file_size_commit_log:
            # A record must fit in one segment with room for its header.
            object.__setattr__(self, "max_message_size",
                               max(0, self.mapped_file_size_commit_log - 1024))
        self.delay_levels_ms()

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: Any
             ) -> MessageStoreConfig:
        """Read ``path`` (default conf/broker.conf when it exists), then apply overrides.

        Overrides use RocketMQ's names (``flushDiskType``) or snake_case
        (``flush_disk_type``). Raises ConfigError naming the key (and file and
        line) for an unknown key or a bad value.
        """
        values: dict[str, Any] = {}
        source = None
        if path is None and os.path.exists(DEFAULT_CONFIG_FILE):
            path = DEFAULT_CONFIG_FILE
        if path is not None:
            source = os.fspath(path)
            for lineno, key, raw in _read_properties(source):
                spec = _lookup(key, f"{source}:{lineno}")
                values[spec.field] = spec.parse(raw, f"{source}:{lineno}")
        for key, raw in overrides.items():
            spec = _lookup(key, "keyword argument")
            values[spec.field] = spec.parse(raw, "keyword argument") if isinstance(raw, str) \
                else spec.check(raw, "keyword argument")
        return cls(**values)

    def delay_levels_ms(self) -> tuple[int, ...]:
        """Return messageDelayLevel as milliseconds, level 1 first."""
        units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
        out = []
        for item in self.message_delay_level.split():
            m = re.fullmatch(r"(\d+)([smhd])", item)
            if not m:
                raise ConfigError(
                    f"messageDelayLevel: {item!r} is not a delay like 10s, 1m, 2h or 1d")
            out.append(int(m.group(1)) * units[m.group(2)])
        if not out:
            raise ConfigError("messageDelayLevel names no delay level")
        return tuple(out)

    def to_properties(self) -> str:
        """Render as broker.conf text (RocketMQ names)."""
        lines = []
        for spec in _KEYS:
            value = getattr(self, spec.field)
            lines.append(f"{spec.name}={str(value).lower() if isinstance(value, bool) else value}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Key:
    name: str  # RocketMQ's camelCase name
    field: str
    kind: type
    choices: tuple[str, ...] = ()
    minimum: int | None = None

    def parse(self, raw: str, where: str) -> Any:
        raw = raw.strip()
        if self.kind is bool:
            if raw.lower() in ("true", "false"):
                return raw.lower() == "true"
            raise ConfigError(f"{self.name} ({where}): expected true or false, got {raw!r}")
        if self.kind is int:
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{self.name} ({where}): expected an integer, got {raw!r}") \
                    from None
            return self.check(value, where)
        return self.check(raw, where)

    def check(self, value: Any, where: str) -> Any:
        at = f" ({where})" if where else ""
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{self.name}{at}: expected an integer, got {value!r}")
        if self.kind is bool and not isinstance(value, bool):
            raise ConfigError(f"{self.name}{at}: expected true or false, got {value!r}")
        if self.kind is str and not isinstance(value, str):
            raise ConfigError(f"{self.name}{at}: expected a string, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name}{at}: expected one of {', '.join(self.choices)}, "
                              f"got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{self.name}{at}: must be >= {self.minimum}, got {value}")
        return value


_KEYS = (
    _Key("storePathRootDir", "store_path_root_dir", str),
    _Key("mappedFileSizeCommitLog", "mapped_file_size_commit_log", int, minimum=4096),
    _Key("mappedFileSizeConsumeQueue", "mapped_file_size_consume_queue", int, minimum=20),
    _Key("maxHashSlotNum", "max_hash_slot_num", int, minimum=1),
    _Key("maxIndexNum", "max_index_num", int, minimum=2),
    _Key("flushDiskType", "flush_disk_type", str, ("ASYNC_FLUSH", "SYNC_FLUSH")),
    _Key("flushIntervalCommitLog", "flush_interval_commit_log", int, minimum=1),
    _Key("flushCommitLogLeastPages", "flush_commit_log_least_pages", int, minimum=0),
    _Key("flushCommitLogThoroughInterval", "flush_commit_log_thorough_interval", int,
         minimum=1),
    _Key("syncFlushTimeout", "sync_flush_timeout", int, minimum=1),
    _Key("messageDelayLevel", "message_delay_level", str),
    _Key("maxMessageSize", "max_message_size", int, minimum=1),
    _Key("brokerName", "broker_name", str),
    _Key("brokerIP1", "broker_ip1", str),
    _Key("listenPort", "listen_port", int, minimum=0),
    _Key("defaultTopicQueueNums", "default_topic_queue_nums", int, minimum=1),
    _Key("autoCreateTopicEnable", "auto_create_topic_enable", bool),
    _Key("maxReconsumeTimes", "max_reconsume_times", int, minimum=0),
    _Key("transactionTimeOut", "transaction_timeout", int, minimum=0),
    _Key("transactionCheckMax", "transaction_check_max", int, minimum=0),
    _Key("longPollingEnable", "long_polling_enable", bool),
    _Key("fileReservedTime", "file_reserved_time", int, minimum=0),
)
_BY_NAME = {k.name: k for k in _KEYS}
_BY_FIELD = {k.field: k for k in _KEYS}
assert set(_BY_FIELD) == {f.name for f in dataclasses.fields(MessageStoreConfig)}


def _lookup(key: str, where: str) -> _Key:
    spec = _BY_NAME.get(key) or _BY_FIELD.get(key)
    if spec is not None:
        return spec
    names = list(_BY_NAME) + list(_BY_FIELD)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown store configuration key {key!r} ({where}){hint}")


def _read_properties(path: str) -> list[tuple[int, str, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read store configuration {path}: {exc}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", stripped)
        if not m:
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {stripped!r}")
        out.append((lineno, m.group(1), m.group(2)))
    return out


# --- names (TopicValidator) ---------------------------------------------------------

_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127
RETRY_OR_DLQ_TOPIC_MAX_LENGTH = 255
GROUP_MAX_LENGTH = 120


def validate_topic(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise InvalidNameError."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"topic name must be a non-empty string, got {name!r}")
    if not _NAME_RE.match(name):
        raise InvalidNameError(
            f"topic name {name!r} may only contain letters, digits, '%', '|', '_' and '-'")
    limit = RETRY_OR_DLQ_TOPIC_MAX_LENGTH if name.startswith(("%RETRY%", "%DLQ%")) \
        else TOPIC_MAX_LENGTH
    if len(name) > limit:
        raise InvalidNameError(f"topic name {name[:20]!r}... has {len(name)} characters, "
                               f"more than {limit}")
    return name


def validate_group(name: object) -> str:
    """Return ``name`` if it is a legal consumer/producer group name, else raise."""
    if not isinstance(name, str) or not name:
        raise InvalidNameError(f"group name must be a non-empty string, got {name!r}")
    if not _NAME_RE.match(name):
        raise InvalidNameError(
            f"group name {name!r} may only contain letters, digits, '%', '|', '_' and '-'")
    if len(name) > GROUP_MAX_LENGTH:
        raise InvalidNameError(f"group name {name[:20]!r}... has {len(name)} characters, "
                               f"more than {GROUP_MAX_LENGTH}")
    return name
