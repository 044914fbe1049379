"""The config/ JSON files: topics, consumer offsets, subscription groups, delay offsets.

RocketMQ writes them with fastjson, which leaves integer map keys bare
(``{"offsetTable":{"TopicA@GroupA":{0:120,1:98}}}``): not strict JSON. We read
them leniently and write integer keys the same way, so a real broker reads
what we write.

Persistence follows ``MixAll.string2File``: write ``<file>.tmp`` and force it,
keep the previous file as ``<file>.bak``, rename the new one in place, force
the directory; loading falls back to ``.bak`` when the file is missing or
unreadable. Several processes share these files, so every change is a
read-modify-write under ``flock`` on ``<file>.lock`` that re-reads the file
first; reads re-load a file whose size or mtime changed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rocketspark.errors import CorruptRecordError

_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def loads_lenient(text: str) -> Any:
    """Parse JSON that may have bare integer object keys (fastjson's output)."""
    out = []
    pos = 0
    for m in _STRING.finditer(text):
        out.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos:]))
    return json.loads("".join(out))


def dumps_fastjson(obj: Any) -> str:
    """Serialise like fastjson: compact, integer map keys written bare."""
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            key = str(k) if isinstance(k, int) and not isinstance(k, bool) else json.dumps(str(k))
            items.append(f"{key}:{dumps_fastjson(v)}")
        return "{" + ",".join(items) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps_fastjson(v) for v in obj) + "]"
    return json.dumps(obj, ensure_ascii=False)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` crash-safely, keeping the old file as ``.bak``."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, path + ".bak")
    os.replace(tmp, path)
    _fsync_dir(directory)


def read_with_backup(path: str) -> Any | None:
    """Return the parsed file, or its ``.bak`` when the file is missing or unreadable.

    None when neither exists; CorruptRecordError when what exists is unreadable.
    """
    errors = []
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        try:
            if not text.strip():
                raise ValueError("empty file")
            return loads_lenient(text)
        except ValueError as exc:
            errors.append(f"{candidate}: {exc}")
    if errors:
        raise CorruptRecordError("metadata file and its backup are unreadable: "
                                 + "; ".join(errors), file=path)
    return None


class JsonTable:
    """One config/ JSON file shared by processes; subclasses give it meaning."""

    file_name = ""

    def __init__(self, config_dir: str):
        self.path = os.path.join(config_dir, self.file_name)
        self._lock_path = self.path + ".lock"
        self._guard = threading.RLock()
        self._stamp: tuple[int, int] | None = None
        self.data: dict[str, Any] = self.empty()
        self._reload(force=True)

    def empty(self) -> dict[str, Any]:
        return {}

    def _current_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _reload(self, force: bool = False) -> None:
        stamp = self._current_stamp()
        if not force and stamp == self._stamp and stamp is not None:
            return
        data = read_with_backup(self.path)
        self.data = self.normalise(data) if data is not None else self.empty()
        self._stamp = stamp

    def normalise(self, data: Any) -> dict[str, Any]:
        return data

    def view(self) -> dict[str, Any]:
        """Return the current contents (re-read if another process changed the file)."""
        with self._guard:
            self._reload()
            return self.data

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with self._guard:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._reload(force=True)
                yield self.data
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def update(self, change: Callable[[dict[str, Any]], bool | None]) -> None:
        """Apply ``change`` under the inter-process lock; persist unless it returns False."""
        with self._locked() as data:
            if change(data) is False:
                return
            self.before_persist(data)
            write_atomically(self.path, self.render(data))
            self._stamp = self._current_stamp()

    def before_persist(self, data: dict[str, Any]) -> None:
        pass

    def render(self, data: dict[str, Any]) -> str:
        return dumps_fastjson(data)


def _bump_version(data: dict[str, Any]) -> None:
    version = data.setdefault("dataVersion", {"counter": 0, "timestamp": 0})
    version["counter"] = int(version.get("counter", 0)) + 1
    version["timestamp"] = int(time.time() * 1000)


class TopicConfigTable(JsonTable):
    """topics.json: ``{"topicConfigTable": {name: TopicConfig}, "dataVersion": ...}``."""

    file_name = "topics.json"

    def empty(self) -> dict[str, Any]:
        return {"topicConfigTable": {}, "dataVersion": {"counter": 0, "timestamp": 0}}

    def normalise(self, data: Any) -> dict[str, Any]:
        data.setdefault("topicConfigTable", {})
        return data

    def get(self, name: str) -> dict[str, Any] | None:
        return self.view()["topicConfigTable"].get(name)

    def names(self) -> list[str]:
        return list(self.view()["topicConfigTable"])

    def create(self, name: str, read_queues: int, write_queues: int, *, perm: int = 6,
               order: bool = False) -> None:
        """Create or change a topic (no write when nothing changes)."""
        cfg = {"topicName": name, "readQueueNums": read_queues, "writeQueueNums": write_queues,
               "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
               "order": order, "attributes": {}}

        def change(data: dict[str, Any]) -> bool:
            old = data["topicConfigTable"].get(name)
            if old is not None and all(old.get(k) == v for k, v in cfg.items()
                                       if k != "attributes"):
                return False
            data["topicConfigTable"][name] = cfg
            return True

        existing = self.get(name)
        if existing is not None and all(existing.get(k) == v for k, v in cfg.items()
                                        if k != "attributes"):
            return
        self.update(change)

    def before_persist(self, data: dict[str, Any]) -> None:
        _bump_version(data)


class ConsumerOffsetTable(JsonTable):
    """consumerOffset.json: ``{"offsetTable": {"topic@group": {queueId: nextOffset}}}``."""

    file_name = "consumerOffset.json"

    def empty(self) -> dict[str, Any]:
        return {"offsetTable": {}}

    def normalise(self, data: Any) -> dict[str, Any]:
        table = data.get("offsetTable") or {}
        data["offsetTable"] = {k: {int(q): int(o) for q, o in v.items()}
                               for k, v in table.items()}
        return data

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}@{group}"

        def change(data: dict[str, Any]) -> bool:
            queues = data["offsetTable"].setdefault(key, {})
            if queues.get(queue_id) == offset:
                return False
            queues[queue_id] = offset
            return True

        self.update(change)

    def commit_many(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit several (topic, queue) offsets in one write."""

        def change(data: dict[str, Any]) -> None:
            for (topic, queue_id), offset in offsets.items():
                data["offsetTable"].setdefault(f"{topic}@{group}", {})[queue_id] = offset

        self.update(change)

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.view()["offsetTable"].get(f"{topic}@{group}", {}).get(queue_id)

    def offsets_of_group(self, group: str) -> dict[tuple[str, int], int]:
        out = {}
        suffix = f"@{group}"
        for key, queues in self.view()["offsetTable"].items():
            if key.endswith(suffix):
                topic = key[: -len(suffix)]
                for q, off in queues.items():
                    out[(topic, q)] = off
        return out

    def groups(self) -> list[str]:
        return sorted({k.rpartition("@")[2] for k in self.view()["offsetTable"]})


class SubscriptionGroupTable(JsonTable):
    """subscriptionGroup.json: per group its retry settings."""

    file_name = "subscriptionGroup.json"

    def __init__(self, config_dir: str, default_retry_max_times: int = 16):
        self.default_retry_max_times = default_retry_max_times
        super().__init__(config_dir)

    def empty(self) -> dict[str, Any]:
        return {"subscriptionGroupTable": {}, "dataVersion": {"counter": 0, "timestamp": 0}}

    def normalise(self, data: Any) -> dict[str, Any]:
        data.setdefault("subscriptionGroupTable", {})
        return data

    def get(self, group: str) -> dict[str, Any] | None:
        return self.view()["subscriptionGroupTable"].get(group)

    def get_or_create(self, group: str, *, retry_max_times: int | None = None
                      ) -> dict[str, Any]:
        cfg = self.get(group)
        if cfg is not None and retry_max_times is None:
            return cfg
        new = {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
               "consumeBroadcastEnable": True, "retryQueueNums": 1,
               "retryMaxTimes": self.default_retry_max_times if retry_max_times is None
               else retry_max_times,
               "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
               "notifyConsumerIdsChangedEnable": True}

        def change(data: dict[str, Any]) -> bool:
            old = data["subscriptionGroupTable"].get(group)
            if old is not None and (retry_max_times is None
                                    or old.get("retryMaxTimes") == retry_max_times):
                return False
            if old is not None:
                old["retryMaxTimes"] = retry_max_times
            else:
                data["subscriptionGroupTable"][group] = new
            return True

        self.update(change)
        return self.get(group) or new

    def retry_max_times(self, group: str) -> int:
        cfg = self.get(group)
        if cfg is None:
            return self.default_retry_max_times
        return int(cfg.get("retryMaxTimes", self.default_retry_max_times))

    def before_persist(self, data: dict[str, Any]) -> None:
        _bump_version(data)


class DelayOffsetTable(JsonTable):
    """delayOffset.json: ``{"offsetTable": {delayLevel: nextOffset}}``."""

    file_name = "delayOffset.json"

    def empty(self) -> dict[str, Any]:
        return {"offsetTable": {}}

    def normalise(self, data: Any) -> dict[str, Any]:
        data["offsetTable"] = {int(k): int(v) for k, v in (data.get("offsetTable") or {}).items()}
        return data

    def get(self, level: int) -> int | None:
        return self.view()["offsetTable"].get(level)

    def set(self, level: int, offset: int) -> None:
        def change(data: dict[str, Any]) -> bool:
            if data["offsetTable"].get(level) == offset:
                return False
            data["offsetTable"][level] = offset
            return True

        self.update(change)
