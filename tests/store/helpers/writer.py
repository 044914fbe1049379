"""A child process that puts messages in a loop and records each acknowledged one.

Usage: python -m tests.store.helpers.writer STORE ACKFILE TAG COUNT BATCH [SYNC|ASYNC]

Each body is ``TAG:seq``. After a put (or put_batch) returns, the bodies are
appended to ACKFILE and the file is flushed, so ACKFILE lists only messages
whose put returned.
"""

from __future__ import annotations

import os
import sys

from rocketspark.store import Message, MessageStore

SMALL = dict(
    mappedFileSizeCommitLog=64 * 1024,
    mappedFileSizeConsumeQueue=20 * 512,
    maxHashSlotNum=512,
    maxIndexNum=4096,
)


def main() -> None:
    store_dir, ack_path, tag, count, batch = sys.argv[1:6]
    flush = sys.argv[6] if len(sys.argv) > 6 else "SYNC"
    count, batch = int(count), int(batch)
    with (
        MessageStore.open(store_dir, flushDiskType=f"{flush}_FLUSH", **SMALL) as store,
        open(ack_path, "a", buffering=1) as acks,
    ):
        if not store.has_topic("crash"):
            store.create_topic("crash", queues=3)
        seq = 0
        print("ready", flush=True)
        while seq < count:
            n = min(batch, count - seq)
            bodies = [f"{tag}:{seq + i}".encode() for i in range(n)]
            keys = [f"k-{tag}-{seq + i}" for i in range(n)]
            if n == 1:
                store.put(Message("crash", bodies[0], keys=[keys[0]], tags="c"))
            else:
                store.put_batch(
                    [
                        Message("crash", b, keys=[k], tags="c")
                        for b, k in zip(bodies, keys, strict=True)
                    ]
                )
            acks.write("".join(b.decode() + "\n" for b in bodies))
            os.fsync(acks.fileno())
            seq += n


if __name__ == "__main__":
    main()
