"""A child process that tails every queue of a topic with long polling.

Usage: python -m tests.store.helpers.tailer STORE OUTFILE EXPECTED

Writes ``queue_id offset body`` lines for every message seen, until EXPECTED
messages were read (or 120 s pass).
"""

from __future__ import annotations

import sys
import time

from rocketspark.store import MessageStore, PullStatus
from tests.store.helpers.writer import SMALL


def main() -> None:
    store_dir, out_path, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seen = 0
    deadline = time.monotonic() + 120
    with MessageStore.open(store_dir, **SMALL) as store, open(out_path, "w") as out:
        print("ready", flush=True)
        while not store.has_topic("crash"):
            time.sleep(0.01)
        queues = store.topic("crash").read_queue_nums
        offsets = [0] * queues
        while seen < expected and time.monotonic() < deadline:
            for q in range(queues):
                res = store.pull("crash", q, offsets[q], max_msgs=128, timeout_ms=5)
                if res.status is PullStatus.FOUND:
                    for m in res.messages:
                        out.write(f"{q} {m.queue_offset} {m.body.decode()}\n")
                    seen += len(res.messages)
                    offsets[q] = res.next_offset
    print("done", seen, flush=True)


if __name__ == "__main__":
    main()
