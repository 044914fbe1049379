"""Small stores for the store tests: a tiny geometry, and a store filled with a few messages."""

from __future__ import annotations

from rocketspark.store import Message, MessageStore

# 4 KiB CommitLog segments and 16 ConsumeQueue entries a file: every test rolls both.
SMALL = dict(
    mappedFileSizeCommitLog=4096,
    mappedFileSizeConsumeQueue=20 * 16,
    maxHashSlotNum=64,
    maxIndexNum=256,
)


def filled_store(root, n: int = 40, **geometry) -> None:
    """Make a store at ``root`` whose topic "orders" (2 queues) holds ``n`` keyed messages."""
    with MessageStore.open(root, **geometry) as s:
        s.create_topic("orders", queues=2)
        s.put_batch(
            [Message("orders", b"m%03d" % i + bytes(300), keys=[f"k{i}"]) for i in range(n)]
        )
