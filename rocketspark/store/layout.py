"""What makes a directory a store, and the geometry its files were made with.

A directory is a store when it holds ``commitlog/``, ``consumequeue/``,
``rocketspark.state`` or ``rocketspark.geometry`` (RocketMQ's broker makes the
first two when it starts), or when it holds the ``lock`` file and nothing but
names a store holds (``checkpoint``, ``config/`` ...: a store whose first open
was cut short). A new store is made only in a directory that does not exist or is
empty, so opening never writes store files among other content.

A store's *geometry* is fixed when it is made: the size of a CommitLog
segment (``mappedFileSizeCommitLog``), of a ConsumeQueue file
(``mappedFileSizeConsumeQueue``) and the dimensions of an index file
(``maxHashSlotNum``, ``maxIndexNum``). rocketspark records it in
``<root>/rocketspark.geometry`` (broker.conf syntax) before it makes any
segment. A store without that file (a RocketMQ broker's, or one written by an
older rocketspark) has it read off its files once and recorded: the CommitLog
and ConsumeQueue sizes from the spacing of file names (or a lone file's
size), the index dimensions from the index files' size, which must fit the
settings, RocketMQ's defaults, or RocketMQ's ratio of four entries per slot.

Opening uses the store's geometry whatever broker.conf or the defaults say;
a geometry value given explicitly (a keyword override, a Spark
``rocketmq.*`` option) that differs is refused with a ConfigError before
any file is touched. A file of another size than the geometry is damage,
reported (SegmentSizeError) and never padded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rocketspark.errors import ConfigError, CorruptRecordError, SegmentSizeError, StorePathError
from rocketspark.store.config import MessageStoreConfig, read_properties
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE
from rocketspark.store.index_file import index_file_size
from rocketspark.store.mapped_file import (
    FILE_NAME_DIGITS,
    fsync_directory,
    is_temporary_name,
)
from rocketspark.store.store_state import (
    COMMIT_POS_OFFSET,
    STATE_FILE,
    STATE_HEADER,
    STATE_MAGIC,
    VALUE_MASK,
)

log = logging.getLogger(__name__)

GEOMETRY_FILE = "rocketspark.geometry"
# broker.conf key -> MessageStoreConfig field, in the order the record lists them.
GEOMETRY_KEYS = {
    "mappedFileSizeCommitLog": "mapped_file_size_commit_log",
    "mappedFileSizeConsumeQueue": "mapped_file_size_consume_queue",
    "maxHashSlotNum": "max_hash_slot_num",
    "maxIndexNum": "max_index_num",
}
# Any one of these makes a directory a store.
_MARKERS = ("commitlog", "consumequeue", STATE_FILE, GEOMETRY_FILE)
# What else the root of a store holds (RocketMQ's and ours).
_STORE_ENTRIES = frozenset(
    {
        "lock",
        "abort",
        "checkpoint",
        "config",
        "index",
        "commitlog",
        "consumequeue",
        "rocketspark.write.lock",
        "rocketspark.flush.lock",
        STATE_FILE,
        GEOMETRY_FILE,
    }
)
# RocketMQ's config files. A directory whose only entry is a config/ holding some of these
# (and nothing else) was prepared for a store's first open, e.g. with the ACL file
# `rocketspark serve` reads (config/plain_acl.yml) written before the store: a new store.
_CONFIG_FILES = frozenset(
    {
        "plain_acl.yml",
        "topics.json",
        "subscriptionGroup.json",
        "consumerOffset.json",
        "delayOffset.json",
    }
)
_ROCKETMQ_INDEX_DIMENSIONS = (5_000_000, 5_000_000 * 4)
UNKNOWN_INDEX = "not told by the size of its index files"

Kind = Literal["absent", "empty", "store", "foreign"]


# --- the directory --------------------------------------------------------------------


def directory_kind(root: str) -> Kind:
    """Say what ``root`` is: absent, an empty directory, a store, or other content.

    Reads only. Raises StorePathError for a path that can hold no store: a
    NUL in it, a file at it or above it, a dangling symbolic link, a
    directory that cannot be listed. Whether an absent store could be made is
    :func:`check_creatable`'s question (a reader's "no store" is the answer).
    """
    if "\x00" in root:
        raise StorePathError(f"store path {root!r} contains a NUL character", path=root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        if os.path.islink(root):
            raise StorePathError(
                f"store path {root} is a symbolic link to "
                f"{os.readlink(root)}, which does not exist",
                path=root,
            ) from None
        return "absent"
    except NotADirectoryError:
        raise StorePathError(
            f"store path {root} lies under {_file_above(root)}, which is a file, not a directory",
            path=root,
        ) from None
    except OSError as exc:
        raise StorePathError(f"store path {root}: {exc.strerror}", path=root) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StorePathError(f"store path {root} is a file, not a directory", path=root)
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise StorePathError(
            f"store directory {root} cannot be listed: {exc.strerror}", path=root
        ) from None
    if not names:
        return "empty"
    if any(m in names and _is_marker(os.path.join(root, m)) for m in _MARKERS):
        return "store"
    # Opening makes the lock file first: with it, only store names (and the hidden
    # temporary files a killed opener leaves) mean a store whose first open was cut
    # short (a lone config/ is as likely an application's).
    if "lock" in names and all(n in _STORE_ENTRIES or is_temporary_name(n) for n in names):
        return "store"
    if names == ["config"] and _holds_config_files_only(os.path.join(root, "config")):
        return "empty"
    return "foreign"


def _holds_config_files_only(config: str) -> bool:
    """True if ``config`` is a directory of RocketMQ's config files, at least one."""
    try:
        entries = os.listdir(config)
    except OSError:  # not a directory, or unreadable: not evidence of a store
        return False
    return bool(entries) and all(
        e in _CONFIG_FILES and os.path.isfile(os.path.join(config, e)) for e in entries
    )


def _is_marker(path: str) -> bool:
    # commitlog/ and consumequeue/ are directories, our files regular files: a file
    # named commitlog among an application's files makes no store.
    if os.path.basename(path) in ("commitlog", "consumequeue"):
        return os.path.isdir(path)
    return os.path.isfile(path)


def check_writable(root: str) -> None:
    """Raise StorePathError unless this process may write in the store directory.

    Every opener writes there (the lock and state files), a reader too.
    """
    if not os.access(root, os.W_OK | os.X_OK):
        raise StorePathError(
            f"store directory {root} is not writable by this user; rocketspark writes its "
            "lock and state files there even to read",
            path=root,
        )


def describe_foreign(root: str) -> str:
    """A few of the entries that make ``root`` not a store, for an error message."""
    names = sorted(os.listdir(root))
    names = [n for n in names if n not in _STORE_ENTRIES] or names
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"{root} is not a store (it has no commitlog/, consumequeue/ or rocketspark.state) "
        f"and is not empty: it holds {shown}"
    )


def check_creatable(root: str) -> None:
    """Raise StorePathError unless a store directory can be made at the absent ``root``."""
    parent = os.path.dirname(root)
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise StorePathError(
            f"store path {root} lies under {_file_above(root)}, which is a file, not a directory",
            path=root,
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StorePathError(
            f"cannot create store directory {root}: {parent} is not writable by this user",
            path=root,
        )


def _file_above(root: str) -> str:
    path = root
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if os.path.lexists(path) and not os.path.isdir(path):
            return path
    return os.path.dirname(root)


# --- geometry -------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreGeometry:
    """The four sizes of a store, by MessageStoreConfig field, and where each came from."""

    values: Mapping[str, int]
    sources: Mapping[str, str]
    recorded: bool  # read from rocketspark.geometry

    def as_config(self) -> dict[str, Any]:
        """The sizes as MessageStoreConfig fields (for ``dataclasses.replace``)."""
        return dict(self.values)


def read_geometry(
    root: str,
    config: MessageStoreConfig | None = None,
    explicit: Mapping[str, str] | None = None,
    *,
    for_check: bool = False,
) -> StoreGeometry:
    """Return the geometry of the store at ``root`` (read only).

    ``config`` supplies the sizes the store has no files of yet (and candidate
    index dimensions); ``explicit`` maps broker.conf keys the caller set
    explicitly to where they were set: one that differs from the store's is
    refused with a ConfigError. Raises SegmentSizeError when files show no
    geometry, CorruptRecordError for an unreadable record. Index dimensions
    the files' size does not tell are a ConfigError, unless ``for_check``
    (only sizes are compared): then any that give that size, their source
    saying so (:data:`UNKNOWN_INDEX`).
    """
    config = config if config is not None else MessageStoreConfig()
    explicit = explicit or {}
    recorded = _read_record(root)
    values: dict[str, int] = {}
    sources: dict[str, str] = {}
    if recorded is not None:
        for field in GEOMETRY_KEYS.values():
            values[field] = recorded[field]
            sources[field] = f"recorded in {os.path.join(root, GEOMETRY_FILE)}"
    else:
        for field, (value, where) in _infer(root, config, for_check).items():
            values[field] = value
            sources[field] = where
    for key, field in GEOMETRY_KEYS.items():
        given = getattr(config, field)
        if field not in values:
            values[field] = given
            sources[field] = "the settings (the store has no such files yet)"
        elif values[field] != given:
            if key in explicit:
                raise ConfigError(
                    f"{key}={given} ({explicit[key]}) does not match the store at {root}: its "
                    f"{key} is {values[field]}, {sources[field]}. A store's geometry is fixed "
                    f"when it is made; open it without {key} (or with {key}={values[field]})"
                )
            log.info(
                "store %s: using its %s %d (%s), not %d",
                root,
                key,
                values[field],
                sources[field],
                given,
            )
    return StoreGeometry(values, sources, recorded is not None)


def explicit_geometry(config: MessageStoreConfig) -> dict[str, str]:
    """The geometry keys of ``config`` that differ from the built-in defaults, each
    counted as set on purpose ("the given config")."""
    defaults = MessageStoreConfig()
    return {
        key: "the given config"
        for key, field in GEOMETRY_KEYS.items()
        if getattr(config, field) != getattr(defaults, field)
    }


def prepare_directory(
    root: str, config: MessageStoreConfig, explicit: Mapping[str, str], create: bool | None
) -> None:
    """Check that a store may be opened at ``root`` (or made there), then make the directory.

    Everything that can refuse the open runs before the first file is written:
    a directory that is not a store (StorePathError unless ``create`` is True),
    no store where ``create`` is False, a directory the process cannot write,
    and an explicit geometry value that differs from the store's (ConfigError).
    """
    kind = directory_kind(root)
    if kind == "foreign" and create is not True:
        raise StorePathError(describe_foreign(root), path=root)
    if kind in ("absent", "empty") and create is False:
        raise StorePathError(f"there is no store at {root}", path=root)
    if kind != "absent":
        check_writable(root)
        read_geometry(root, config, explicit)
    else:
        check_creatable(root)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:  # e.g. a dangling symbolic link among its parents
        raise StorePathError(
            f"cannot create store directory {root}: {exc.strerror} ({exc.filename})",
            path=root,
        ) from exc


def settle_geometry(
    root: str, config: MessageStoreConfig, explicit: Mapping[str, str]
) -> StoreGeometry:
    """Return the store's geometry, recorded first if it was not (call under the store
    lock: another process may have made the store meanwhile)."""
    geometry = read_geometry(root, config, explicit)
    if not geometry.recorded and not record_geometry(root, geometry):
        geometry = read_geometry(root, config, explicit)
    return geometry


def record_geometry(root: str, geometry: StoreGeometry) -> bool:
    """Write ``geometry`` to ``<root>/rocketspark.geometry`` unless the file exists.

    The file appears complete or not at all. Returns False when another
    process recorded one first (read it again: it is the store's).
    """
    path = os.path.join(root, GEOMETRY_FILE)
    if os.path.exists(path):
        return False
    lines = ["# The geometry of this store, fixed when it was made (rocketspark)."]
    lines += [f"{key}={geometry.values[field]}" for key, field in GEOMETRY_KEYS.items()]
    tmp = os.path.join(root, f".{GEOMETRY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.write(fd, ("\n".join(lines) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here; the store lock serialises first openers
            if os.path.exists(path):
                return False
            os.rename(tmp, path)
        fsync_directory(root)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read_record(root: str) -> dict[str, int] | None:
    path = os.path.join(root, GEOMETRY_FILE)
    if not os.path.exists(path):
        return None
    try:
        props = {key: raw for _, key, raw in read_properties(path)}
        values = {field: int(props[key]) for key, field in GEOMETRY_KEYS.items()}
        MessageStoreConfig(**dict[str, Any](values))  # in range
    except (ConfigError, KeyError, ValueError) as exc:
        raise CorruptRecordError(
            f"the store's geometry record is unreadable ({exc})", file=path
        ) from None
    return values


def _segment_files(
    directory: str, *, digits: int = FILE_NAME_DIGITS, remove_temporaries: bool = False
) -> list[tuple[int, int, str]]:
    """(start offset, size, path) of each segment in ``directory``, by start offset.

    ``remove_temporaries`` also deletes, in the same listing, the hidden files a
    killed process left half made (first opener only: nobody makes a file then).
    """
    out = []
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                name = e.name
                if len(name) == digits and name.isdigit():
                    with contextlib.suppress(FileNotFoundError):  # expired meanwhile
                        out.append((int(name), e.stat().st_size, e.path))
                elif (
                    remove_temporaries
                    and is_temporary_name(name)
                    and not e.is_dir(follow_symlinks=False)
                ):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out.sort()
    return out


def _spacing(files: list[tuple[int, int, str]]) -> int | None:
    gaps = [b[0] - a[0] for a, b in zip(files, files[1:], strict=False)]
    return min(gaps) if gaps else None


def _queue_dirs(root: str) -> Iterator[str]:
    base = os.path.join(root, "consumequeue")
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for topic in sorted(os.listdir(base)):
            tdir = os.path.join(base, topic)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for qid in sorted(os.listdir(tdir)):
                    if qid.isdigit():
                        yield os.path.join(tdir, qid)


def _index_files(root: str) -> list[tuple[int, int, str]]:
    return _segment_files(os.path.join(root, "index"), digits=17)


def _infer(
    root: str, config: MessageStoreConfig, for_check: bool = False
) -> dict[str, tuple[int, str]]:
    """The sizes the files of a store without a record show, with where each was read."""
    found: dict[str, tuple[int, str]] = {}
    cl = _segment_files(os.path.join(root, "commitlog"))
    if cl:
        size = _spacing(cl)
        if size is None:
            start, size, path = cl[0]
            _check_lone_segment(path, start, size, "CommitLog", 4096, 1)
            _check_state_reaches(root, start + size, path, size)
        found["mapped_file_size_commit_log"] = (
            size,
            f"read from its CommitLog segments ({os.path.join(root, 'commitlog')})",
        )
    spacings: Counter[int] = Counter()
    lone: list[tuple[int, int, str]] = []
    for qdir in _queue_dirs(root):
        files = _segment_files(qdir)
        spacing = _spacing(files)
        if spacing is not None:
            spacings[spacing] += 1
        elif files:
            lone.append(files[0])
    if spacings or lone:
        if spacings:
            size = spacings.most_common(1)[0][0]
        else:
            # A truncated file is shorter than the others: the largest is whole.
            start, size, path = max(lone, key=lambda f: f[1])
            _check_lone_segment(
                path, start, size, "ConsumeQueue", CQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE
            )
        found["mapped_file_size_consume_queue"] = (
            size,
            f"read from its ConsumeQueue files ({os.path.join(root, 'consumequeue')})",
        )
    index = _index_files(root)
    if index:
        size = max(f[1] for f in index)
        dims = _index_dimensions(size, config)
        where = f"read from its index files ({os.path.join(root, 'index')})"
        spare = size - index_file_size(0, 2)  # entries beyond 2 and slots, 4 bytes each
        if dims is None and for_check and spare >= 4 and spare % 4 == 0:
            dims, where = (spare // 4, 2), f"{UNKNOWN_INDEX} ({size} bytes)"
        if dims is None:
            raise ConfigError(
                f"the index files of the store at {root} are {size} bytes, which neither "
                f"maxHashSlotNum={config.max_hash_slot_num} maxIndexNum={config.max_index_num} "
                f"({index_file_size(config.max_hash_slot_num, config.max_index_num)} bytes) "
                "nor RocketMQ's defaults give: open it with the maxHashSlotNum and maxIndexNum "
                "it was written with"
            )
        found["max_hash_slot_num"] = (dims[0], where)
        found["max_index_num"] = (dims[1], where)
    return found


def _index_dimensions(size: int, config: MessageStoreConfig) -> tuple[int, int] | None:
    candidates = [(config.max_hash_slot_num, config.max_index_num), _ROCKETMQ_INDEX_DIMENSIONS]
    header = index_file_size(0, 0)
    per_slot = index_file_size(1, 4) - header  # RocketMQ's default: four entries a slot
    if size > header and (size - header) % per_slot == 0:
        slots = (size - header) // per_slot
        candidates.append((slots, 4 * slots))
    for slots, entries in candidates:
        if index_file_size(slots, entries) == size:
            return slots, entries
    return None


def _check_lone_segment(
    path: str, start: int, size: int, what: str, minimum: int, unit: int
) -> None:
    """A lone segment's size is the geometry only if it could be a whole segment."""
    if size < minimum or size % unit or start % size:
        raise SegmentSizeError(
            f"{what} file {path} is {size} bytes, which cannot be a whole segment "
            f"(at least {minimum} bytes, a multiple of {unit}, dividing its start offset "
            f"{start}): it is truncated, and the store records no geometry to say by how much",
            file=path,
            expected=None,
            actual=size,
        )


def _check_state_reaches(root: str, end: int, path: str, size: int) -> None:
    """A store written by rocketspark says where its CommitLog ends: past a lone
    segment's end means the segment lost its tail."""
    try:
        with open(os.path.join(root, STATE_FILE), "rb") as f:
            head = f.read(COMMIT_POS_OFFSET + 8)
    except OSError:
        return
    if len(head) < COMMIT_POS_OFFSET + 8:
        return
    magic, version, _ = STATE_HEADER.unpack_from(head)
    commit_pos = int.from_bytes(head[COMMIT_POS_OFFSET:], "big", signed=True)
    if version >= 2:  # a checked field: a 16-bit check over a 48-bit value
        commit_pos &= VALUE_MASK
    if magic == STATE_MAGIC and commit_pos > end:
        raise SegmentSizeError(
            f"CommitLog segment {path} is {size} bytes, but the store's data reaches offset "
            f"{commit_pos}: it is truncated",
            file=path,
            expected=None,
            actual=size,
        )


# --- the files against the geometry ----------------------------------------------------


def wrong_size_files(
    root: str,
    geometry: StoreGeometry,
    *,
    remove_temporaries: bool = False,
    seen: list[str] | None = None,
) -> list[SegmentSizeError]:
    """Every CommitLog, ConsumeQueue and index file whose size is not the geometry's.

    One listing of each directory; ``remove_temporaries``: see :func:`check_file_sizes`.
    ``seen`` collects the path of every file looked at.
    """
    g = geometry.values
    out = []
    index_size = index_file_size(g["max_hash_slot_num"], g["max_index_num"])
    checks = [
        (
            os.path.join(root, "commitlog"),
            g["mapped_file_size_commit_log"],
            "CommitLog segment",
            "mappedFileSizeCommitLog",
            FILE_NAME_DIGITS,
        )
    ]
    checks += [
        (
            qdir,
            g["mapped_file_size_consume_queue"],
            "ConsumeQueue file",
            "mappedFileSizeConsumeQueue",
            FILE_NAME_DIGITS,
        )
        for qdir in _queue_dirs(root)
    ]
    checks.append(
        (os.path.join(root, "index"), index_size, "index file", "maxHashSlotNum/maxIndexNum", 17)
    )
    for directory, size, what, key, digits in checks:
        for start, actual, path in _segment_files(
            directory, digits=digits, remove_temporaries=remove_temporaries
        ):
            if seen is not None:
                seen.append(path)
            if actual != size or (digits == FILE_NAME_DIGITS and start % size):
                out.append(_size_error(path, what, key, size, actual))
    if remove_temporaries:
        _segment_files(root, remove_temporaries=True)  # the geometry record's
    return out


def check_file_sizes(root: str, geometry: StoreGeometry) -> list[str]:
    """Raise SegmentSizeError for the first file :func:`wrong_size_files` finds.

    Also deletes the segment and index files a killed process left half made:
    only for the first opener, which holds the store exclusively. Returns the
    paths of the CommitLog, ConsumeQueue and index files (one listing serves
    the open's later walks too).
    """
    seen: list[str] = []
    wrong = wrong_size_files(root, geometry, remove_temporaries=True, seen=seen)
    if not wrong:
        return seen
    first = wrong[0]
    if len(wrong) > 1:
        first.args = (
            f"{first}; and {len(wrong) - 1} more file(s) of the wrong size "
            "(`rocketspark store check` lists them)",
        )
    raise first


def _size_error(path: str, what: str, key: str, expected: int, actual: int) -> SegmentSizeError:
    if actual == expected:
        how = f"not at a multiple of {expected} (its name is not a segment start)"
    else:
        how = "truncated" if actual < expected else "longer than the store's geometry"
    return SegmentSizeError(
        f"{what} {path} is {actual} bytes, expected {expected} (the store's {key}): {how}",
        file=path,
        expected=expected,
        actual=actual,
    )


__all__ = [
    "GEOMETRY_FILE",
    "GEOMETRY_KEYS",
    "StoreGeometry",
    "check_creatable",
    "check_file_sizes",
    "check_writable",
    "describe_foreign",
    "directory_kind",
    "read_geometry",
    "record_geometry",
    "wrong_size_files",
]
