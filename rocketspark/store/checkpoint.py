"""The checkpoint file: when CommitLog, ConsumeQueues and index were last flushed.

Layout (4 KiB, big-endian)::

    physicMsgTimestamp:i64 logicsMsgTimestamp:i64 indexMsgTimestamp:i64
    masterFlushedOffset:i64 confirmPhyOffset:i64        (the last two: RocketMQ 5.x)
"""

from __future__ import annotations

import mmap
import os
import struct

from rocketspark.store.mapped_file import reserve_blocks

CHECKPOINT_SIZE = 4096
CHECKPOINT = struct.Struct(
    ">q"  # physicMsgTimestamp
    "q"  # logicsMsgTimestamp
    "q"  # indexMsgTimestamp
    "q"  # masterFlushedOffset
    "q"  # confirmPhyOffset
)


class StoreCheckpoint:
    """The mapped checkpoint file of a store."""

    def __init__(self, path: str):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < CHECKPOINT_SIZE:
                try:
                    os.ftruncate(fd, CHECKPOINT_SIZE)
                    reserve_blocks(fd, CHECKPOINT_SIZE, path, fresh=size == 0)
                except BaseException:
                    if size == 0:
                        os.unlink(path)
                    raise
            self._mm = mmap.mmap(fd, CHECKPOINT_SIZE)
        finally:
            os.close(fd)

    def read(self) -> tuple[int, int, int, int, int]:
        return CHECKPOINT.unpack_from(self._mm, 0)

    @property
    def physic_msg_timestamp(self) -> int:
        return self.read()[0]

    @property
    def logics_msg_timestamp(self) -> int:
        return self.read()[1]

    @property
    def index_msg_timestamp(self) -> int:
        return self.read()[2]

    @property
    def min_timestamp(self) -> int:
        """The earliest of the CommitLog and ConsumeQueue flush times (recovery's safe point)."""
        phy, logics, _, _, _ = self.read()
        return min(phy, logics)

    def update(
        self,
        *,
        physic: int | None = None,
        logics: int | None = None,
        index: int | None = None,
        confirm_phy_offset: int | None = None,
    ) -> None:
        """Advance the given timestamps (never backwards: several processes update it)."""
        cur = list(self.read())
        for i, v in ((0, physic), (1, logics), (2, index)):
            if v is not None and v > cur[i]:
                cur[i] = v
        if confirm_phy_offset is not None:
            cur[4] = confirm_phy_offset
        CHECKPOINT.pack_into(self._mm, 0, *cur)

    def flush(self) -> None:
        self._mm.flush()

    def close(self) -> None:
        self._mm.close()
