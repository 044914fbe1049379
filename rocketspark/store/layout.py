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
import struct
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rocketspark.errors import ConfigError, CorruptRecordError, SegmentSizeError, StorePathError
from rocketspark.store.config import MessageStoreConfig, _read_properties
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE
from rocketspark.store.index_file import index_file_size
from rocketspark.store.mapped_file import (
    FILE_NAME_DIGITS,
    fsync_directory,
    is_temporary_name,
)

log = logging.getLogger(__name__)

GEOMETRY_FILE = "rocketspark.geometry"
STATE_FILE = "rocketspark.state"  # store_state.STATE_FILE (not imported: that module locks)
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
_STORE_ENTRIES = frozenset({
    "lock", "abort", "checkpoint", "config", "index", "commitlog", "consumequeue",
    "rocketspark.write.lock", "rocketspark.flush.lock", STATE_FILE, GEOMETRY_FILE,
})
_ROCKETMQ_INDEX_DIMENSIONS = (5_000_000, 5_000_000 * 4)
_STATE_COMMIT_POS = struct.Struct(">8siiq")  # magic, version, reserved, COMMIT_POS
_STATE_MAGIC = b"RSPKSTAT"

Kind = Literal["absent", "empty", "store", "foreign"]


# --- the directory --------------------------------------------------------------------


def directory_kind(root: str) -> Kind:
    """Say what ``root`` is: absent, an empty directory, a store, or other content.

    Reads only. Raises StorePathError for a path that can hold no store: a
    NUL in it, a file at it or above it, a directory that cannot be listed,
    or (for "absent") a nearest existing directory that is not writable.
    """
    if "\x00" in root:
        raise StorePathError(f"store path {root!r} contains a NUL character", path=root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        _check_creatable(root)
        return "absent"
    except NotADirectoryError:
        raise StorePathError(f"store path {root} lies under {_file_above(root)}, which is a "
                             "file, not a directory", path=root) from None
    except OSError as exc:
        raise StorePathError(f"store path {root}: {exc.strerror}", path=root) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StorePathError(f"store path {root} is a file, not a directory", path=root)
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise StorePathError(f"store directory {root} cannot be listed: {exc.strerror}",
                             path=root) from None
    if not names:
        return "empty"
    if any(m in names for m in _MARKERS):
        return "store"
    # Opening makes the lock file first: with it, only store names mean a store whose
    # first open was cut short (a lone config/ is as likely an application's).
    if "lock" in names and all(n in _STORE_ENTRIES for n in names):
        return "store"
    return "foreign"


def check_writable(root: str) -> None:
    """Raise StorePathError unless this process may write in the store directory.

    Every opener writes there (the lock and state files), a reader too.
    """
    if not os.access(root, os.W_OK | os.X_OK):
        raise StorePathError(
            f"store directory {root} is not writable by this user; rocketspark writes its "
            "lock and state files there even to read", path=root)


def describe_foreign(root: str) -> str:
    """A few of the entries that make ``root`` not a store, for an error message."""
    names = sorted(n for n in os.listdir(root) if n not in _STORE_ENTRIES)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"{root} is not a store (it has no commitlog/, consumequeue/ or rocketspark.state) "
            f"and is not empty: it holds {shown}")


def _check_creatable(root: str) -> None:
    parent = os.path.dirname(root)
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise StorePathError(f"store path {root} lies under {_file_above(root)}, which is a "
                             "file, not a directory", path=root)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StorePathError(f"cannot create store directory {root}: {parent} is not "
                             "writable by this user", path=root)


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


def read_geometry(root: str, config: MessageStoreConfig | None = None,
                  explicit: Mapping[str, str] | None = None) -> StoreGeometry:
    """Return the geometry of the store at ``root`` (read only).

    ``config`` supplies the sizes the store has no files of yet (and candidate
    index dimensions); ``explicit`` maps broker.conf keys the caller set
    explicitly to where they were set: one that differs from the store's is
    refused with a ConfigError. Raises SegmentSizeError when files show no
    geometry, CorruptRecordError for an unreadable record.
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
        for field, (value, where) in _infer(root, config).items():
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
                    f"when it is made; open it without {key} (or with {key}={values[field]})")
            log.info("store %s: using its %s %d (%s), not %d", root, key, values[field],
                     sources[field], given)
    return StoreGeometry(values, sources, recorded is not None)


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
        props = {key: raw for _, key, raw in _read_properties(path)}
        values = {field: int(props[key]) for key, field in GEOMETRY_KEYS.items()}
        MessageStoreConfig(**dict[str, Any](values))  # in range
    except (ConfigError, KeyError, ValueError) as exc:
        raise CorruptRecordError(f"the store's geometry record is unreadable ({exc})",
                                 file=path) from None
    return values


def _segment_files(directory: str) -> list[tuple[int, int, str]]:
    """(start offset, size, path) of each segment in ``directory``, by start offset."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        if len(name) == FILE_NAME_DIGITS and name.isdigit():
            path = os.path.join(directory, name)
            out.append((int(name), os.path.getsize(path), path))
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
            if not os.path.isdir(tdir):
                continue
            for qid in sorted(os.listdir(tdir)):
                if qid.isdigit():
                    yield os.path.join(tdir, qid)


def _index_files(root: str) -> list[str]:
    directory = os.path.join(root, "index")
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(directory, n) for n in sorted(names) if len(n) == 17 and n.isdigit()]


def _infer(root: str, config: MessageStoreConfig) -> dict[str, tuple[int, str]]:
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
            size, f"read from its CommitLog segments ({os.path.join(root, 'commitlog')})")
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
            _check_lone_segment(path, start, size, "ConsumeQueue", CQ_STORE_UNIT_SIZE,
                                CQ_STORE_UNIT_SIZE)
        found["mapped_file_size_consume_queue"] = (
            size, f"read from its ConsumeQueue files ({os.path.join(root, 'consumequeue')})")
    index = _index_files(root)
    if index:
        size = max(os.path.getsize(p) for p in index)
        dims = _index_dimensions(size, config)
        if dims is None:
            raise ConfigError(
                f"the index files of the store at {root} are {size} bytes, which neither "
                f"maxHashSlotNum={config.max_hash_slot_num} maxIndexNum={config.max_index_num} "
                f"({index_file_size(config.max_hash_slot_num, config.max_index_num)} bytes) "
                "nor RocketMQ's defaults give: open it with the maxHashSlotNum and maxIndexNum "
                "it was written with")
        where = f"read from its index files ({os.path.join(root, 'index')})"
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


def _check_lone_segment(path: str, start: int, size: int, what: str, minimum: int,
                        unit: int) -> None:
    """A lone segment's size is the geometry only if it could be a whole segment."""
    if size < minimum or size % unit or start % size:
        raise SegmentSizeError(
            f"{what} file {path} is {size} bytes, which cannot be a whole segment "
            f"(at least {minimum} bytes, a multiple of {unit}, dividing its start offset "
            f"{start}): it is truncated, and the store records no geometry to say by how much",
            file=path, expected=None, actual=size)


def _check_state_reaches(root: str, end: int, path: str, size: int) -> None:
    """A store written by rocketspark says where its CommitLog ends: past a lone
    segment's end means the segment lost its tail."""
    try:
        with open(os.path.join(root, STATE_FILE), "rb") as f:
            head = f.read(_STATE_COMMIT_POS.size)
    except OSError:
        return
    if len(head) < _STATE_COMMIT_POS.size:
        return
    magic, version, _, commit_pos = _STATE_COMMIT_POS.unpack(head)
    if version >= 2:  # a checked field: a 16-bit check over a 48-bit value
        commit_pos &= (1 << 48) - 1
    if magic == _STATE_MAGIC and commit_pos > end:
        raise SegmentSizeError(
            f"CommitLog segment {path} is {size} bytes, but the store's data reaches offset "
            f"{commit_pos}: it is truncated", file=path, expected=None, actual=size)


# --- the files against the geometry ----------------------------------------------------


def wrong_size_files(root: str, geometry: StoreGeometry) -> list[SegmentSizeError]:
    """Every CommitLog, ConsumeQueue and index file whose size is not the geometry's."""
    g = geometry.values
    out = []
    checks = [(os.path.join(root, "commitlog"), g["mapped_file_size_commit_log"],
               "CommitLog segment", "mappedFileSizeCommitLog")]
    checks += [(qdir, g["mapped_file_size_consume_queue"], "ConsumeQueue file",
                "mappedFileSizeConsumeQueue") for qdir in _queue_dirs(root)]
    for directory, size, what, key in checks:
        for start, actual, path in _segment_files(directory):
            if actual != size or start % size:
                out.append(_size_error(path, what, key, size, actual))
    index_size = index_file_size(g["max_hash_slot_num"], g["max_index_num"])
    for path in _index_files(root):
        actual = os.path.getsize(path)
        if actual != index_size:
            out.append(_size_error(path, "index file", "maxHashSlotNum/maxIndexNum",
                                   index_size, actual))
    return out


def check_file_sizes(root: str, geometry: StoreGeometry) -> None:
    """Raise SegmentSizeError for the first file :func:`wrong_size_files` finds."""
    wrong = wrong_size_files(root, geometry)
    if not wrong:
        return
    first = wrong[0]
    if len(wrong) > 1:
        first.args = (f"{first}; and {len(wrong) - 1} more file(s) of the wrong size "
                      "(`rocketspark store check` lists them)",)
    raise first


def _size_error(path: str, what: str, key: str, expected: int, actual: int) -> SegmentSizeError:
    if actual == expected:
        how = f"not at a multiple of {expected} (its name is not a segment start)"
    else:
        how = "truncated" if actual < expected else "longer than the store's geometry"
    return SegmentSizeError(f"{what} {path} is {actual} bytes, expected {expected} "
                            f"(the store's {key}): {how}", file=path, expected=expected,
                            actual=actual)


def remove_temporary_files(root: str) -> None:
    """Delete segment and index files a killed process left half made.

    Only for the first opener, which holds the store exclusively: nobody is
    making a file then.
    """
    dirs = [os.path.join(root, "commitlog"), os.path.join(root, "index"), root]
    dirs += list(_queue_dirs(root))
    for directory in dirs:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(directory):
                if is_temporary_name(name) and not os.path.isdir(os.path.join(directory, name)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))


__all__ = [
    "GEOMETRY_FILE",
    "GEOMETRY_KEYS",
    "StoreGeometry",
    "check_file_sizes",
    "check_writable",
    "describe_foreign",
    "directory_kind",
    "read_geometry",
    "record_geometry",
    "remove_temporary_files",
    "wrong_size_files",
]
