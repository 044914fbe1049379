"""The README's main job: a short pipeline on an embedded store.

A producer writes orders to a 4-queue topic, a consumer group reads part of
them (committing its offsets as it goes), and the lag that is left is shown,
as ``rocketspark --store DIR group offsets billing`` shows it. Run:
``python -m rocketspark.demo`` (``--store DIR`` keeps the store).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from rocketspark.store import Message, MessageStore, PullStatus


def run(path: str, messages: int) -> dict[str, object]:
    with MessageStore.open(path) as store:
        store.create_topic("orders", queues=4)
        t0 = time.perf_counter()
        batch = [
            Message(
                "orders",
                json.dumps({"order": i, "amount": i % 97}).encode(),
                tags="paid" if i % 3 == 0 else "created",
                keys=(f"order-{i}",),
            )
            for i in range(messages)
        ]
        results = store.put_batch(batch)
        put_s = time.perf_counter() - t0
        print(f"produced {len(results)} messages to 'orders' in {put_s * 1000:.1f} ms")
        last = results[-1]
        print(f"  last: queue {last.queue_id} offset {last.queue_offset} msgId {last.msg_id}")

        # A consumer group that only wants paid orders reads half of each queue.
        consumed = 0
        for queue_id in range(4):
            offset = store.committed_offset("billing", "orders", queue_id) or 0
            stop = store.max_offset("orders", queue_id) // 2
            while offset < stop:
                res = store.pull("orders", queue_id, offset, max_msgs=64, expression="paid")
                if res.status is PullStatus.NO_NEW_MSG:
                    break
                consumed += sum(1 for m in res.messages if m.queue_offset < stop)
                offset = min(res.next_offset, stop)
                store.commit_offset("billing", "orders", queue_id, offset)
        print(f"group 'billing' consumed {consumed} paid orders")

        lag = store.lag("billing", "orders")
        for (topic, queue_id), behind in sorted(lag.items()):
            print(f"  lag {topic}/{queue_id}: {behind}")
        found = store.query_by_key("orders", "order-42")
        print(f"query by key 'order-42': {[m.body.decode() for m in found]}")
        return {"produced": len(results), "consumed": consumed, "lag": sum(lag.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store directory (default: a fresh temporary one)")
    parser.add_argument(
        "--messages", type=int, default=10_000, help="orders to produce (default 10000)"
    )
    args = parser.parse_args(argv)
    path = args.store or tempfile.mkdtemp(prefix="rocketspark-demo-")
    try:
        run(path, args.messages)
    finally:
        if not args.store:
            shutil.rmtree(path, ignore_errors=True)
    if args.store:
        kept = os.path.abspath(path)
        print(f"demo finished; store kept at {kept}")
        print(f"  its lag again: rocketspark --store {kept} group offsets billing")
    else:
        print("demo finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
