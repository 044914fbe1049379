"""Open stores, one per (directory, overrides) and process.

Spark runs the source's planning in one driver-side Python process and every
``read``/``write`` in Python workers, which it reuses across tasks. Opening a
store maps files and reads its config JSON, so each process keeps the stores
it opened until it exits instead of opening one per task. What crosses a
pickle is a :class:`StoreRef` (the directory and overrides), never a store.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from rocketspark.errors import ConfigError, StorePathError
from rocketspark.store import MessageStore, MessageStoreConfig
from rocketspark.store.config import canonical_key
from rocketspark.store.layout import describe_foreign, directory_kind

log = logging.getLogger(__name__)
_lock = threading.Lock()
_open: dict[StoreRef, MessageStore] = {}
_pid = os.getpid()


@dataclass(frozen=True)
class StoreRef:
    """How to open a store: an absolute directory and broker.conf overrides."""

    root: str
    overrides: tuple[tuple[str, str], ...] = ()

    @classmethod
    def resolve(cls, path: str | None, overrides: Mapping[str, str]) -> StoreRef:
        """Resolve ``path`` (default: conf/broker.conf's storePathRootDir) to an absolute one.

        Raises ConfigError for a bad override, before anything is opened.
        """
        kw = dict(overrides)
        if path:
            given = [k for k in kw if canonical_key(k) == "storePathRootDir"]
            if given:
                raise ConfigError(
                    f"the store directory is given twice: as store and as "
                    f"{given[0]}; give only one of them"
                )
            kw["storePathRootDir"] = path
        config = MessageStoreConfig.load(None, **kw)
        kw.pop("storePathRootDir", None)
        return cls(os.path.abspath(config.store_path_root_dir), tuple(sorted(kw.items())))

    def require(self) -> StoreRef:
        """The reference, checked to name an existing store (before planning).

        A typo in the option must not leave an empty store behind, nor read as
        "no such topic"; a directory that is not a store gets no store files.
        """
        kind = directory_kind(self.root)
        if kind == "foreign":
            raise StorePathError(f"option store: {describe_foreign(self.root)}", path=self.root)
        if kind != "store":
            raise StorePathError(
                f"option store: there is no store at {self.root} (create one "
                "first: MessageStore.open(path).create_topic(...), or "
                "`rocketspark --store DIR topic create NAME`)",
                path=self.root,
            )
        return self

    def open(self) -> MessageStore:
        """Return this process's open store for the reference (opened on first use)."""
        global _pid
        with _lock:
            if os.getpid() != _pid:  # a forked child must not share its parent's mappings
                _open.clear()
                _pid = os.getpid()
            store = _open.get(self)
            if store is not None and store.replaced():
                # Deleted (and maybe created again) under a running application: what
                # the old instance wrote would go to files no longer in the directory.
                _open.pop(self)
                log.warning(
                    "store %s was deleted or replaced while open in this process; opening it again",
                    self.root,
                )
                store.close()
                store = None
            if store is None or store._closed:
                self.require()
                # A geometry option that differs from the store's is refused naming the
                # option the user wrote, not a keyword argument. Spark's Python workers
                # end without close() (os._exit, or killed by the daemon): their exit is
                # clean unless they left a write unfinished.
                config = MessageStoreConfig.load(
                    None, storePathRootDir=self.root, **dict(self.overrides)
                )
                explicit = {
                    canonical_key(k) or k: f"option rocketmq.{k}" for k, _ in self.overrides
                }
                store = MessageStore(
                    config, create=False, explicit=explicit, exit_without_close=True
                )
                _open[self] = store
            return store


def close_all() -> None:
    """Close every store this process opened (at exit, and in tests)."""
    with _lock:
        stores = list(_open.values())
        _open.clear()
    for s in stores:
        s.close()


def location_key(where: str) -> str:
    """A checkpoint location or table path as one string however it is spelled.

    A local path is made absolute (``file:`` URIs too); other URIs (s3://,
    dbfs:/) are kept as given, less a trailing slash.
    """
    if where.startswith("file:"):
        where = "/" + where[len("file:") :].lstrip("/")
    if "://" in where or (":" in where.split("/", 1)[0] and not os.path.isabs(where)):
        return where.rstrip("/")
    return os.path.abspath(where)


atexit.register(close_all)
