"""The one exception hierarchy of rocketspark.

Every error the store, the data source or the command line raises on purpose
derives from :class:`RocketSparkError`; callers catch a subclass to handle one
kind of fault. ``retriable`` says whether the same call may succeed if repeated
unchanged (a timeout may; a bad name never will).
"""

from __future__ import annotations

from errno import ENOSPC as _ENOSPC

__all__ = [
    "RocketSparkError",
    "ConfigError",
    "InvalidNameError",
    "UnknownTopicError",
    "MessageTooLargeError",
    "PropertiesTooLargeError",
    "OffsetOutOfRangeError",
    "StoreLockedError",
    "StoreClosedError",
    "CorruptRecordError",
    "FlushTimeoutError",
    "TransactionError",
    "StorePathError",
    "SegmentSizeError",
    "TopicShrinkError",
    "StoreDamagedError",
    "InvalidMessageError",
    "DiskFullError",
    "RemotingError",
    "RemotingFrameError",
    "RemotingConnectError",
    "RemotingTimeoutError",
    "RemotingCommandError",
    "BrokerBusyError",
    "NoMasterError",
    "UsageError",
    "AclFileError",
]


class RocketSparkError(Exception):
    """Root of every error rocketspark raises on purpose."""

    retriable: bool = False


class ConfigError(RocketSparkError, ValueError):
    """A configuration value or option is missing, mistyped or out of range."""


class InvalidNameError(ConfigError):
    """A topic or group name breaks RocketMQ's charset or length rules."""


class UnknownTopicError(RocketSparkError, KeyError):
    """The topic does not exist in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown topic"


class MessageTooLargeError(RocketSparkError, ValueError):
    """The encoded message is larger than maxMessageSize."""


class PropertiesTooLargeError(MessageTooLargeError):
    """The encoded properties are longer than 32767 bytes."""


class OffsetOutOfRangeError(RocketSparkError, IndexError):
    """A queue offset lies outside [min offset, max offset]."""


class StoreLockedError(RocketSparkError):
    """The store directory is held by a process that cannot share it."""

    retriable = True


class StoreClosedError(RocketSparkError):
    """The store was used after close()."""


class CorruptRecordError(RocketSparkError):
    """Bytes on disk do not decode as the spec says; carries the file and offset."""

    def __init__(self, message: str, *, file: str | None = None, offset: int | None = None):
        where = []
        if file is not None:
            where.append(f"file {file}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.file = file
        self.offset = offset


class FlushTimeoutError(RocketSparkError):
    """SYNC_FLUSH could not force the data to disk in time (FLUSH_DISK_TIMEOUT)."""

    retriable = True


class TransactionError(RocketSparkError):
    """A transactional half message cannot be committed or rolled back as asked."""


class StorePathError(ConfigError):
    """The store path cannot be opened as a store: a file, under a file, holding a NUL,
    not writable, or a directory with other content that is not a store."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class SegmentSizeError(CorruptRecordError):
    """A CommitLog, ConsumeQueue or index file is not the size of the store's geometry.

    ``expected`` is None when the store records no geometry and the file
    cannot be a whole segment of any.
    """

    def __init__(self, message: str, *, file: str, expected: int | None, actual: int):
        super().__init__(message, file=file)
        self.expected = expected
        self.actual = actual


class TopicShrinkError(ConfigError):
    """Fewer queues were asked for a topic whose dropped queues hold messages."""


class StoreDamagedError(CorruptRecordError):
    """The CommitLog is damaged where valid records follow: the store refuses writes.

    Carries the damaged ``file`` and ``offset``, the first valid record after
    the damage (``resume``) and how many valid records follow (``following``).
    Reads still work; ``rocketspark store recover --truncate-at OFFSET`` (or
    ``MessageStore.open(path, truncate_at=OFFSET)``) discards everything from
    the damage on, after which writes resume.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        offset: int | None = None,
        resume: int | None = None,
        following: int = 0,
    ):
        super().__init__(message, file=file, offset=offset)
        self.resume = resume
        self.following = following


class InvalidMessageError(ConfigError):
    """A message field is missing, mistyped or out of range; names the field and,
    in a batch, the row. Raised before any queue offset is taken or byte written."""


class SinkJobEndedError(TransactionError):
    """A task of an exactly-once batch write was about to write after its job had ended.

    Its job was committed or aborted (a task Spark was still cancelling, a
    speculative attempt): the task writes nothing more and fails.
    """


class DiskFullError(RocketSparkError, OSError):
    """The disk of the store cannot take a write; nothing of it was written.

    Raised before any byte of the refused put is written: when creating a file
    could not reserve its blocks, or when the store's file system is used past
    diskSpaceWarningLevelRatio or has too little room left for the files a put
    needs. Reads still work; writes succeed again once space is freed.
    ``file`` names the file (or directory) and ``needed`` the bytes asked for.
    """

    retriable = True

    def __init__(self, message: str, *, file: str | None = None, needed: int | None = None):
        RocketSparkError.__init__(self, message)
        self.errno = _ENOSPC  # for callers that test OSError.errno
        self.file = file
        self.needed = needed

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "disk full"


class RemotingError(RocketSparkError):
    """A request over RocketMQ's TCP remoting protocol failed."""


class RemotingFrameError(RemotingError):
    """Bytes on the wire do not decode as a remoting frame, or a command cannot be encoded.

    Raised for a frame length beyond 16 MiB or below the header, a header
    length beyond the frame, a malformed JSON or ROCKETMQ header, an unknown
    serialize type, or a header field that is missing or not a number.
    """


class RemotingConnectError(RemotingError):
    """The connection to ``address`` could not be made or was lost; a later call reconnects."""

    retriable = True

    def __init__(self, message: str, *, address: str):
        super().__init__(message)
        self.address = address


class RemotingTimeoutError(RemotingError):
    """No answer came from ``address`` in time; the request may still have been executed."""

    retriable = True

    def __init__(self, message: str, *, address: str):
        super().__init__(message)
        self.address = address


class RemotingCommandError(RemotingError):
    """The server answered with a response code other than the one expected.

    ``code`` is the response code (a ``ResponseCode`` value) and ``remark`` the
    server's explanation, if it sent one.
    """

    def __init__(self, message: str, *, code: int, remark: str | None = None):
        super().__init__(message)
        self.code = code
        self.remark = remark


class BrokerBusyError(RemotingCommandError):
    """The broker refused the request for now (SYSTEM_BUSY, flow control); retry later."""

    retriable = True


class NoMasterError(RemotingError):
    """A broker group has no master in the NameServers' route (a failover under way):
    a send may go to another broker group's queue meanwhile."""

    retriable = True


class UsageError(ConfigError):
    """A command-line argument does not fit what it names: a body file that cannot be
    read, a queue the topic does not have, two arguments that exclude each other."""


class AclFileError(ConfigError):
    """An ACL file (``plain_acl.yml``) cannot be read or breaks its format; names the
    ``file`` and, when one is at fault, the ``line``. Never quotes a secret key."""

    def __init__(self, message: str, *, file: str, line: int | None = None):
        where = f"{file}, line {line}" if line is not None else file
        super().__init__(f"{where}: {message}")
        self.file = file
        self.line = line
