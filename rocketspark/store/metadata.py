"""The JSON files under ``<storePathRootDir>/config/``, as RocketMQ's broker writes them.

    consumerOffset.json     {"offsetTable": {"topic@group": {queueId: nextOffset}}}
    subscriptionGroup.json  {"dataVersion": DV, "subscriptionGroupTable": {group: GroupConfig}}
    GroupConfig             {"groupName": group, "retryMaxTimes": 16, "retryQueueNums": 1, ...}
    delayOffset.json        {"offsetTable": {delayLevel: nextOffset}}
    DV (DataVersion)        {"counter": n, "stateVersion": 0, "timestamp": ms}

topics.json (RocketMQ's TopicConfigManager) has its own module,
:mod:`rocketspark.store.topic_config`, on the :class:`JsonTable` base defined here.

RocketMQ serialises with fastjson, which writes integer map keys bare
(``{0:120,1:98}``), so these files are not strict JSON. :func:`loads_lenient`
reads them (and strict JSON); :func:`dumps_fastjson` writes integer keys bare
again, compact rather than in fastjson's pretty layout, which every fastjson
reader accepts. Fields this module does not know (``attributes``,
``forbiddenTable``, a 5.x ``dataVersion`` in consumerOffset.json ...) are kept
as they are.

Persistence (:func:`write_json`): write ``<file>.tmp`` and fsync it, keep the
current file as ``<file>.bak``, rename the ``.tmp`` over the file, fsync the
directory. Loading (:func:`read_json`) falls back to ``.bak`` when the file is
missing or unreadable, like RocketMQ's ConfigManager.

Several processes open one store at once (a Spark driver and its workers), so
each table changes its file only under ``flock`` on ``<file>.lock`` and re-reads
the file inside that lock before changing it: updates from different processes
never overwrite each other. Readers check the file's identity (inode, mtime,
size) on every call and re-read it when another process has replaced it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rocketspark.errors import CorruptRecordError
from rocketspark.message.fastjson import dumps_fastjson, loads_lenient
from rocketspark.message.names import validate_group, validate_topic
from rocketspark.store.mapped_file import disk_full, fsync_directory

__all__ = [
    "CONSUMER_OFFSET_FILE",
    "SUBSCRIPTION_GROUP_FILE",
    "DELAY_OFFSET_FILE",
    "TOPIC_GROUP_SEPARATOR",
    "ConsumerOffsetTable",
    "DelayOffsetTable",
    "SubscriptionGroupTable",
    "read_json",
    "JsonTable",
    "as_dict",
    "new_data_version",
    "write_json",
]

CONSUMER_OFFSET_FILE = "consumerOffset.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
DELAY_OFFSET_FILE = "delayOffset.json"
SINK_LEDGER_FILE = "rocketsparkSinks.json"
TMP_SUFFIX = ".tmp"
BAK_SUFFIX = ".bak"
LOCK_SUFFIX = ".lock"
TOPIC_GROUP_SEPARATOR = "@"


# --- atomic files with a backup ----------------------------------------------------

FileStamp = tuple[int, int, int, int]  # (device, inode, mtime_ns, size)
_STALE: FileStamp = (-1, -1, -1, -1)  # matches no file: forces a re-read


def _stamp(st: os.stat_result) -> FileStamp:
    # Every write renames a new inode into place, so the inode changes even when
    # two writes fall in the same mtime tick and leave the same size.
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _stat_stamp(path: str) -> FileStamp | None:
    try:
        return _stamp(os.stat(path))
    except FileNotFoundError:
        return None


def _keep_backup(path: str) -> None:
    """Make ``<path>.bak`` a copy of ``path`` as it is now (``path`` must exist)."""
    bak = path + BAK_SUFFIX
    try:
        os.unlink(bak)
    except FileNotFoundError:
        pass
    try:
        # A hard link costs nothing and stays the old content once the file is replaced.
        os.link(path, bak)
    except OSError:
        # File systems without hard links: copy, then force the copy.
        shutil.copyfile(path, bak)
        with open(bak, "rb+") as f:
            os.fsync(f.fileno())


def _replace(path: str, data: bytes, *, backup: bool) -> None:
    """Write ``data`` to ``path`` crash-safely (tmp, fsync, .bak, rename, fsync dir).

    ``backup`` keeps the current file as ``.bak``: pass False when the current
    file is known to be unreadable, so that a good ``.bak`` is not replaced by it.
    Writers of one path must be serialised by the caller (they share ``.tmp``).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # The old file stays as it was; the half-written copy goes.
        os.unlink(tmp)
        raise disk_full(path, len(data), exc) from None
    finally:
        os.close(fd)
    if backup and os.path.exists(path):
        _keep_backup(path)
    os.replace(tmp, path)
    fsync_directory(directory)


def write_json(path: str | os.PathLike[str], obj: Any, *, bare_int_keys: bool = True) -> None:
    """Persist ``obj`` to ``path`` as RocketMQ does, keeping the previous file as ``.bak``.

    Integer dict keys are written bare (fastjson's form) unless
    ``bare_int_keys`` is False. The previous file becomes ``.bak`` only if it
    parses, so a damaged file never replaces a good backup. Not safe against a
    concurrent writer of the same path: the tables below serialise writers with
    a file lock.
    """
    path = os.fspath(path)
    data = dumps_fastjson(obj, bare_int_keys=bare_int_keys).encode("utf-8")
    _replace(path, data, backup=_parses(path))


def _parses(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        loads_lenient(text)
    except (OSError, ValueError):
        return False
    return True


def _read_one(path: str, decode: Callable[[Any], Any]) -> tuple[Any, FileStamp]:
    """Return (decoded content, stamp) of ``path``; OSError / ValueError when unusable."""
    with open(path, "rb") as f:
        stamp = _stamp(os.fstat(f.fileno()))
        raw = f.read()
    text = raw.decode("utf-8")
    if not text.strip():
        raise ValueError("the file is empty")
    try:
        return decode(loads_lenient(text)), stamp
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"unexpected content: {exc!r}") from None


def _read_with_backup(
    path: str, decode: Callable[[Any], Any]
) -> tuple[Any | None, FileStamp | None, bool]:
    """Return (content or None, stamp of ``path``, whether ``path`` itself was usable).

    Falls back to ``.bak`` when ``path`` is missing or unusable. Content is
    None when neither file exists. Raises CorruptRecordError when the file is
    unusable and so is its backup (or there is none), naming both.
    """
    problems = []
    try:
        content, stamp = _read_one(path, decode)
        return content, stamp, True
    except FileNotFoundError:
        main_missing = True
    except (OSError, ValueError) as exc:
        main_missing = False
        problems.append(f"{path}: {exc}")
    main_stamp = _stat_stamp(path)
    bak = path + BAK_SUFFIX
    try:
        content, _ = _read_one(bak, decode)
        return content, main_stamp, False
    except FileNotFoundError:
        if main_missing:
            return None, None, False
        problems.append(f"{bak}: there is no backup")
    except (OSError, ValueError) as exc:
        problems.append(f"{bak}: {exc}")
    raise CorruptRecordError(
        f"metadata file {os.path.basename(path)} and its backup are unreadable: "
        + "; ".join(problems),
        file=path,
    )


def read_json(path: str | os.PathLike[str]) -> Any | None:
    """Return the parsed content of ``path``, or of ``path.bak`` when ``path`` is unreadable.

    Returns None when neither exists. Raises CorruptRecordError naming the file
    when it cannot be read (missing, empty, garbage) and neither can its backup.
    """
    content, _, _ = _read_with_backup(os.fspath(path), lambda obj: obj)
    return content


# --- tables ------------------------------------------------------------------------


def new_data_version() -> dict[str, int]:
    return {"counter": 0, "stateVersion": 0, "timestamp": int(time.time() * 1000)}


def _next_version(data: dict[str, Any]) -> None:
    """Advance ``dataVersion`` as RocketMQ's DataVersion.nextVersion does."""
    version = data.get("dataVersion")
    if not isinstance(version, dict):
        version = data["dataVersion"] = new_data_version()
    version["counter"] = int(version.get("counter", 0)) + 1
    version["timestamp"] = int(time.time() * 1000)


def as_dict(value: Any, what: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not an object")
    return value


def _int_keyed(table: Any, what: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in as_dict(table, what).items()}


class JsonTable:
    """One config/ JSON file shared by threads and processes.

    The content is a dict kept in memory and re-read whenever the file on disk
    has changed. Subclasses say what an empty file holds, how to check and
    normalise what was read (``_decode``) and whether a change advances
    ``dataVersion``.
    """

    file_name = ""
    versioned = False

    def __init__(self, config_dir: str | os.PathLike[str]):
        self.config_dir = os.fspath(config_dir)
        self.path = os.path.join(self.config_dir, self.file_name)
        self.lock_path = self.path + LOCK_SUFFIX
        self._lock = threading.RLock()
        self._data: dict[str, Any] = self._empty()
        self._stamp: FileStamp | None = None
        self._file_ok = False
        self.load()

    # -- to override --

    def _empty(self) -> dict[str, Any]:
        raise NotImplementedError

    def _decode(self, obj: Any) -> dict[str, Any]:
        """Check and normalise parsed content; raise KeyError/TypeError/ValueError if wrong."""
        raise NotImplementedError

    # -- reading --

    def load(self) -> None:
        """Re-read the file now, from ``.bak`` if it is unreadable.

        Raises CorruptRecordError when neither the file nor its backup is readable.
        """
        with self._lock:
            content, stamp, ok = _read_with_backup(self.path, self._decode)
            self._data = content if content is not None else self._empty()
            self._stamp = stamp
            self._file_ok = ok

    def _current(self) -> dict[str, Any]:
        """Return the content, re-read first if another process replaced the file."""
        with self._lock:
            if _stat_stamp(self.path) != self._stamp:
                self.load()
            return self._data

    # -- writing --

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        # A fresh descriptor for every lock: flock belongs to the open file, and
        # one inherited across fork() would be shared with the parent process.
        os.makedirs(self.config_dir, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _modify(self, change: Callable[[dict[str, Any]], bool]) -> None:
        """Apply ``change`` to the file's latest content and persist it if it returns True.

        Runs under the thread lock and the inter-process file lock, and re-reads
        the file inside them, so concurrent changes from other processes are kept.
        """
        with self._lock, self._file_lock():
            self.load()
            try:
                if not change(self._data):
                    return
                if self.versioned:
                    _next_version(self._data)
                self._write()
            except BaseException:
                self._stamp = _STALE  # the content in memory was not written: re-read it
                raise

    def _write(self) -> None:
        data = dumps_fastjson(self._data).encode("utf-8")
        _replace(self.path, data, backup=self._file_ok)
        self._stamp = _stat_stamp(self.path)
        self._file_ok = True

    def persist(self) -> None:
        """Write the file now (every change is already written as it is made).

        Creates the file when it does not exist yet and rewrites one read from
        ``.bak`` or from strict JSON in RocketMQ's form. Re-reads it under the
        inter-process lock first, so nothing another process wrote is lost.
        """
        with self._lock, self._file_lock():
            self.load()
            self._write()


class ConsumerOffsetTable(JsonTable):
    """consumerOffset.json: per ``topic@group`` and queue, the next offset to consume.

    A commit is written when it is made, unless it is ``deferred``: a broker's
    (``rocketspark serve``'s) commits are kept in memory and written by :meth:`flush`,
    which its owner calls every flushConsumerOffsetInterval (5 s) and at close, as
    RocketMQ's ConsumerOffsetManager persists its table. Reads of this instance see
    the deferred commits at once; other processes see them when they are flushed. A
    flush writes only the entries deferred, merged into the file's latest content
    under the inter-process lock (as every write is), so commits other processes
    made in the meantime are kept; a commit that is not deferred replaces a deferred
    one of the same queue. A process killed between flushes loses the deferred
    commits of the last interval (its consumers consume those messages again).
    """

    file_name = CONSUMER_OFFSET_FILE

    def __init__(self, config_dir: str | os.PathLike[str]):
        # (topic@group, queue id) -> offset: deferred commits not written yet
        self._pending: dict[tuple[str, int], int] = {}
        self._pending_lock = threading.Lock()
        super().__init__(config_dir)

    def _empty(self) -> dict[str, Any]:
        return {"offsetTable": {}}

    def _decode(self, obj: Any) -> dict[str, Any]:
        data = as_dict(obj, CONSUMER_OFFSET_FILE)
        data["offsetTable"] = {
            key: _int_keyed(queues, key)
            for key, queues in as_dict(data.get("offsetTable"), "offsetTable").items()
        }
        return data

    @staticmethod
    def key(group: str, topic: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``offset`` as the group's next offset to consume in the queue."""
        self.commit_many(group, {(topic, queue_id): offset})

    def commit_many(
        self, group: str, offsets: Mapping[tuple[str, int], int], *, deferred: bool = False
    ) -> None:
        """Record several ``(topic, queue_id) -> next offset`` of one group in one write
        (``deferred``: in memory, written by the next :meth:`flush`).

        Raises InvalidNameError for a group or topic name RocketMQ would refuse
        (which also keeps the ``topic@group`` keys unambiguous).
        """
        validate_group(group)
        for topic, _ in offsets:
            validate_topic(topic)
        wanted = {(self.key(group, topic), int(q)): int(o) for (topic, q), o in offsets.items()}
        pending = self._pending
        if deferred:
            with self._pending_lock:
                pending.update(wanted)
            return
        if pending:
            with self._pending_lock:
                for entry in wanted:
                    pending.pop(entry, None)
        current = self._current()["offsetTable"]
        if all(current.get(k, {}).get(q) == o for (k, q), o in wanted.items()):
            return

        def change(data: dict[str, Any]) -> bool:
            table = data["offsetTable"]
            changed = False
            for (key, queue_id), offset in wanted.items():
                queues = table.setdefault(key, {})
                if queues.get(queue_id) != offset:
                    queues[queue_id] = offset
                    changed = True
            return changed

        self._modify(change)

    def flush(self) -> None:
        """Write the deferred commits now (nothing to do without any)."""
        pending = self._pending
        if not pending:
            return
        with self._pending_lock:
            written = dict(pending)

        def change(data: dict[str, Any]) -> bool:
            table = data["offsetTable"]
            changed = False
            for (key, queue_id), offset in written.items():
                queues = table.setdefault(key, {})
                if queues.get(queue_id) != offset:
                    queues[queue_id] = offset
                    changed = True
            return changed

        self._modify(change)
        with self._pending_lock:
            for entry, offset in written.items():
                if pending.get(entry) == offset:  # not committed again while written
                    del pending[entry]

    def _with_pending(self) -> dict[str, dict[int, int]]:
        """The offset table as this process sees it: the file's, then the deferred commits."""
        table = self._current()["offsetTable"]
        if not self._pending:
            return table
        with self._pending_lock:
            pending = list(self._pending.items())
        table = {key: dict(queues) for key, queues in table.items()}
        for (key, queue_id), offset in pending:
            table.setdefault(key, {})[queue_id] = offset
        return table

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """Return the group's next offset in the queue, or None if it never committed one."""
        key = self.key(group, topic)
        if self._pending:
            offset = self._pending.get((key, queue_id))
            if offset is not None:
                return offset
        return self._current()["offsetTable"].get(key, {}).get(queue_id)

    def offsets_of_group(self, group: str) -> dict[tuple[str, int], int]:
        """Return every ``(topic, queue_id) -> next offset`` the group committed."""
        out = {}
        for key, queues in self._with_pending().items():
            topic, sep, owner = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if sep and owner == group:
                for queue_id, offset in queues.items():
                    out[(topic, queue_id)] = offset
        return out

    def groups(self) -> list[str]:
        """Return the groups that committed any offset, sorted."""
        return sorted(
            {
                key.rpartition(TOPIC_GROUP_SEPARATOR)[2]
                for key in self._with_pending()
                if TOPIC_GROUP_SEPARATOR in key
            }
        )


class SubscriptionGroupTable(JsonTable):
    """subscriptionGroup.json: each consumer group's settings, among them retryMaxTimes."""

    file_name = SUBSCRIPTION_GROUP_FILE
    versioned = True

    def __init__(self, config_dir: str | os.PathLike[str], default_retry_max_times: int = 16):
        self.default_retry_max_times = default_retry_max_times
        super().__init__(config_dir)

    def _empty(self) -> dict[str, Any]:
        return {"dataVersion": new_data_version(), "subscriptionGroupTable": {}}

    def _decode(self, obj: Any) -> dict[str, Any]:
        data = as_dict(obj, SUBSCRIPTION_GROUP_FILE)
        table = data["subscriptionGroupTable"] = as_dict(
            data.get("subscriptionGroupTable"), "subscriptionGroupTable"
        )
        for name, cfg in table.items():
            as_dict(cfg, f"group {name}")
        return data

    def _new_group(self, group: str) -> dict[str, Any]:
        # SubscriptionGroupConfig's defaults, in fastjson's (alphabetical) field order.
        return {
            "brokerId": 0,
            "consumeBroadcastEnable": True,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "groupName": group,
            "notifyConsumerIdsChangedEnable": True,
            "retryMaxTimes": self.default_retry_max_times,
            "retryQueueNums": 1,
            "whichBrokerWhenConsumeSlowly": 1,
        }

    def get(self, group: str) -> dict[str, Any] | None:
        """Return a copy of the group's config, or None if the group does not exist."""
        cfg = self._current()["subscriptionGroupTable"].get(group)
        return dict(cfg) if cfg is not None else None

    def names(self) -> list[str]:
        """Return the names of all groups, in file order."""
        return list(self._current()["subscriptionGroupTable"])

    def get_or_create(self, group: str) -> dict[str, Any]:
        """Return a copy of the group's config, creating it with the defaults if needed."""
        validate_group(group)
        cfg = self.get(group)
        if cfg is not None:
            return cfg
        result: dict[str, Any] = {}

        def change(data: dict[str, Any]) -> bool:
            table = data["subscriptionGroupTable"]
            created = group not in table
            if created:
                table[group] = self._new_group(group)
            result.update(table[group])
            return created

        self._modify(change)
        return result

    def retry_max_times(self, group: str) -> int:
        """Return the group's retryMaxTimes, or the default for a group that does not exist."""
        cfg = self.get(group)
        if cfg is None or "retryMaxTimes" not in cfg:
            return self.default_retry_max_times
        return int(cfg["retryMaxTimes"])


class DelayOffsetTable(JsonTable):
    """delayOffset.json: per delay level, the next SCHEDULE_TOPIC_XXXX offset to deliver."""

    file_name = DELAY_OFFSET_FILE

    def _empty(self) -> dict[str, Any]:
        return {"offsetTable": {}}

    def _decode(self, obj: Any) -> dict[str, Any]:
        data = as_dict(obj, DELAY_OFFSET_FILE)
        data["offsetTable"] = _int_keyed(data.get("offsetTable"), "offsetTable")
        return data

    def get(self, level: int) -> int | None:
        """Return the next offset to deliver of the level, or None if none was recorded."""
        return self._current()["offsetTable"].get(level)

    def set(self, level: int, offset: int) -> None:
        """Record ``offset`` as the next offset to deliver of the level."""
        level, offset = int(level), int(offset)
        if self.get(level) == offset:
            return

        def change(data: dict[str, Any]) -> bool:
            if data["offsetTable"].get(level) == offset:
                return False
            data["offsetTable"][level] = offset
            return True

        self._modify(change)

    def offsets(self) -> dict[int, int]:
        """Return a copy of every level's next offset."""
        return dict(self._current()["offsetTable"])


class SinkLedgerTable(JsonTable):
    """rocketsparkSinks.json: what each exactly-once Spark sink committed (ours, not RocketMQ's).

    Per sink id: ``committed``, the highest Spark batch id whose half messages
    are committed, ``pending``, a batch being committed: its id and the
    half-queue offset runs ``[start, end)`` it covers, and ``query``, the id of
    the streaming query that committed (Spark keeps it in the checkpoint: a
    new id means a new checkpoint, whose batch ids start again). A pending
    batch is written before its halves are committed and cleared after, so a
    crash in between is finished on the next start rather than guessed at.
    """

    file_name = SINK_LEDGER_FILE

    def _empty(self) -> dict[str, Any]:
        return {"sinks": {}}

    def _decode(self, obj: Any) -> dict[str, Any]:
        data = as_dict(obj, SINK_LEDGER_FILE)
        sinks = as_dict(data.get("sinks", {}), "sinks")
        for sink_id, entry in sinks.items():
            entry = as_dict(entry, f"sink {sink_id}")
            entry["committed"] = int(entry.get("committed", -1))
            pending = entry.get("pending")
            if pending is not None:
                pending = as_dict(pending, f"pending batch of sink {sink_id}")
                pending["batch"] = int(pending["batch"])
                pending["runs"] = [[int(a), int(b)] for a, b in pending["runs"]]
                pending["query"] = _optional_text(pending.get("query"), sink_id)
            entry["pending"] = pending
            entry["query"] = _optional_text(entry.get("query"), sink_id)
            sinks[sink_id] = entry
        data["sinks"] = sinks
        return data

    def get(self, sink_id: str) -> tuple[int, tuple[int, list[tuple[int, int]]] | None]:
        """Return (last committed batch id or -1, pending (batch id, runs) or None)."""
        entry = self._current()["sinks"].get(sink_id)
        if entry is None:
            return -1, None
        pending = entry["pending"]
        return entry["committed"], (
            None if pending is None else (pending["batch"], [(a, b) for a, b in pending["runs"]])
        )

    def query(self, sink_id: str) -> str | None:
        """The id of the streaming query that last committed for ``sink_id`` (None: unknown)."""
        entry = self._current()["sinks"].get(sink_id)
        return None if entry is None else entry.get("query")

    def pending_query(self, sink_id: str) -> str | None:
        """The query id recorded with the pending batch of ``sink_id`` (None: none or unknown)."""
        entry = self._current()["sinks"].get(sink_id)
        pending = None if entry is None else entry["pending"]
        return None if pending is None else pending.get("query")

    def begin(
        self, sink_id: str, batch_id: int, runs: list[tuple[int, int]], query: str | None = None
    ) -> None:
        """Record ``batch_id`` (of ``query``) as being committed with these half-offset runs."""

        def change(data: dict[str, Any]) -> bool:
            entry = data["sinks"].setdefault(sink_id, _new_sink())
            entry["pending"] = {
                "batch": int(batch_id),
                "runs": [[a, b] for a, b in runs],
                "query": query,
            }
            return True

        self._modify(change)

    def finish(self, sink_id: str, batch_id: int, query: str | None = None) -> None:
        """Record that ``batch_id`` is committed (and nothing is pending).

        A ``query`` other than the one recorded starts the sink's batch ids
        again (its checkpoint is new); otherwise the highest id is kept.
        """

        def change(data: dict[str, Any]) -> bool:
            entry = data["sinks"].setdefault(sink_id, _new_sink())
            if query is not None and entry.get("query") not in (None, query):
                entry["committed"] = int(batch_id)
            else:
                entry["committed"] = max(int(entry["committed"]), int(batch_id))
            if query is not None:
                entry["query"] = query
            entry["pending"] = None
            return True

        self._modify(change)


def _new_sink() -> dict[str, Any]:
    return {"committed": -1, "pending": None, "query": None}


def _optional_text(value: Any, sink_id: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"sink {sink_id}: query id {value!r} is not a string")
    return value
