"""A child process that prepares half messages, then dies inside their commit.

Usage: python -m tests.store.helpers.killed_commit STORE COUNT MODE

MODE ``before-ops``: SIGKILL itself once the committed copies are in the
CommitLog but before the op record is. MODE ``after-ops``: once both are in,
before the append is published (COMMIT_POS). Prints the half queue offsets as
one line of comma-separated integers before dying.
"""

from __future__ import annotations

import os
import signal
import sys

from rocketspark.store import MessageStore

SMALL = dict(mappedFileSizeCommitLog=1 << 20, maxHashSlotNum=64, maxIndexNum=4096)


def main() -> None:
    store_dir, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = MessageStore.open(store_dir, **SMALL)
    if not store.has_topic("out"):
        store.create_topic("out", queues=2)
    halves = store.prepare_columns(
        [b"row-%d" % i for i in range(count)],
        topic="out",
        producer_group="sink",
        keys=[f"k{i}" for i in range(count)],
    )
    print(",".join(str(r.queue_offset) for r in halves), flush=True)
    log = store.commit_log
    if mode == "before-ops":

        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        log.append = die
    else:
        write = log.write

        def write_then_die(writes):
            write(writes)
            os.kill(os.getpid(), signal.SIGKILL)

        log.write = write_then_die
    store.commit_transaction(halves)
    raise SystemExit("the commit returned: it was meant to be killed")


if __name__ == "__main__":
    main()
