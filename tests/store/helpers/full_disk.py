"""Child processes for the full-disk tests.

Usage::

    python -m tests.store.helpers.full_disk write STORE ACKFILE CONFIG_JSON {close|kill}
    python -m tests.store.helpers.full_disk read STORE OUTFILE CONFIG_JSON

``write`` puts messages (single puts and batches, alternately) until a put
fails, appending each acknowledged body to ACKFILE, then prints the failure's
class name and either closes the store or SIGKILLs itself. ``read`` opens the
store (or prints ``open: <error>``), writes every body of topic ``full`` to
OUTFILE, tries one put and prints ``put: <outcome>``. Any exit other than these is the failure under
test (SIGBUS, an unexpected exception).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from rocketspark.store import Message, MessageStore, PullStatus

TOPIC = "full"


def write(store_dir: str, ack_path: str, config: dict, mode: str) -> None:
    store = MessageStore.open(store_dir, **config)
    if not store.has_topic(TOPIC):
        store.create_topic(TOPIC, queues=3)
    seq = 0
    with open(ack_path, "a", buffering=1) as acks:
        try:
            while True:
                n = 1 if seq % 2 == 0 else 7
                bodies = [f"m{seq + i}:".encode() + b"x" * 300 for i in range(n)]
                if n == 1:
                    store.put(Message(TOPIC, bodies[0], keys=[f"k{seq}"], tags="t"))
                else:
                    store.put_batch(
                        [
                            Message(TOPIC, b, keys=[f"k{seq + i}"], tags="t")
                            for i, b in enumerate(bodies)
                        ]
                    )
                acks.write("".join(b.decode() + "\n" for b in bodies))
                os.fsync(acks.fileno())
                seq += n
        except Exception as exc:  # the outcome under test: reported, not hidden
            print(f"failed: {type(exc).__name__}: {exc}", flush=True)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            store.close()


def bodies_of(store: MessageStore) -> list[str]:
    """Every body of TOPIC, queue by queue."""
    out = []
    for q in range(store.topic(TOPIC).read_queue_nums):
        off = 0
        while True:
            res = store.pull(TOPIC, q, off, max_msgs=256)
            if res.status is not PullStatus.FOUND:
                break
            out += [m.body.decode() for m in res.messages]
            off = res.next_offset
    return out


def read(store_dir: str, out_path: str, config: dict) -> None:
    try:
        store = MessageStore.open(store_dir, **config)
    except Exception as exc:
        print(f"open: {type(exc).__name__}: {exc}", flush=True)
        return
    with store, open(out_path, "w") as out:
        out.write("".join(body + "\n" for body in bodies_of(store)))
        try:
            store.put(Message(TOPIC, b"after", tags="t"))
            print("put: ok", flush=True)
        except Exception as exc:
            print(f"put: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5])
    else:
        read(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
