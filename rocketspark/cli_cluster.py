"""The ``rocketspark`` commands against a RocketMQ cluster (``--namesrv host:port;...``).

The same commands as on a store, through the :class:`~rocketspark.client.Client`
interface: ``topic create`` / ``topic list``, ``send``, ``tail``, ``group offsets``
(``--topic`` is needed: a client cannot list a group's topics), ``query``.
``schedule run`` and ``store ...`` are about a store directory and refuse
``--namesrv`` (a broker delivers its delayed messages itself).

Queues are ``broker/queueId``; ``--queue N`` picks queue N of every broker.
Credentials come from ``--access-key`` / ``--secret-key`` or the environment
(ROCKETMQ_ACCESS_KEY / ROCKETMQ_SECRET_KEY).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, TextIO

from rocketspark.client import Client, ClientRef, Message, MessageQueue
from rocketspark.errors import ConfigError, UsageError


def connect(args: argparse.Namespace) -> Client:
    ref = ClientRef.cluster(args.namesrv, access_key=args.access_key, secret_key=args.secret_key)
    return ref.connect()


def topic_create(args: argparse.Namespace, out: TextIO) -> int:
    if args.order or args.force:
        raise ConfigError("--order and --force apply to a store's topic, not a cluster's")
    client = connect(args)
    info = client.create_topic(args.name, queues=args.queues or 8)
    queues = ", ".join(str(mq) for mq in client.queues(args.name))
    print(f"topic {info.name}: {info.write_queue_nums} queues ({queues})", file=out)
    return 0


def topic_list(args: argparse.Namespace, out: TextIO, table: Any) -> int:
    client = connect(args)
    rows = []
    for info in client.topics():
        if info.name.startswith(("rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC", "TBW102")):
            continue
        total = sum(client.max_offset(mq) for mq in client.queues(info.name))
        rows.append((info.name, info.read_queue_nums, total))
    table(out, ["topic", "queues", "messages"], rows)
    return 0


def send(args: argparse.Namespace, out: TextIO, body: bytes, props: dict[str, str]) -> int:
    client = connect(args)
    msg = Message(
        args.topic,
        body,
        tags=args.tags,
        keys=tuple(args.keys or ()),
        properties=props,
        queue_id=args.queue,
        sharding_key=args.sharding_key,
        delay_level=args.delay_level,
    )
    (r,) = client.put_batch([msg])
    print(
        f"{r.status.value} topic={r.topic} broker={r.broker} queue={r.queue_id} "
        f"offset={r.queue_offset} msgId={r.msg_id} uniqKey={r.uniq_key}",
        file=out,
    )
    return 0


def _queues(client: Client, topic: str, queue: int | None) -> list[MessageQueue]:
    queues = client.queues(topic)
    chosen = [mq for mq in queues if queue is None or mq.queue_id == queue]
    if queue is not None and not chosen:
        per_broker = max((mq.queue_id for mq in queues), default=-1) + 1
        raise UsageError(
            f"queue {queue} of topic {topic!r} does not exist (its brokers have "
            f"{per_broker} queues at most)"
        )
    return chosen


def tail(args: argparse.Namespace, out: TextIO, progress: Callable[[int], Any]) -> int:
    """Print the messages; ``progress(total)`` makes the bar of queue offsets read."""
    client = connect(args)
    queues = _queues(client, args.topic, args.queue)
    start = args.start or ("group" if args.group else "earliest")
    offsets: dict[MessageQueue, int] = {}
    for mq in queues:
        if start == "group":
            committed = client.committed_offset(args.group, mq)
            offsets[mq] = client.min_offset(mq) if committed is None else committed
        elif start == "earliest":
            offsets[mq] = client.min_offset(mq)
        elif start == "latest":
            offsets[mq] = client.max_offset(mq)
        else:
            offsets[mq] = int(start)
    bar = progress(sum(max(0, client.max_offset(mq) - offsets[mq]) for mq in queues))
    try:
        return _tail(args, out, client, queues, offsets, bar)
    finally:
        bar.close()


def _tail(
    args: argparse.Namespace,
    out: TextIO,
    client: Client,
    queues: list[MessageQueue],
    offsets: dict[MessageQueue, int],
    bar: Any,
) -> int:
    shown = read = 0
    while True:
        moved = False
        for mq in queues:
            end = client.max_offset(mq)
            if offsets[mq] >= end:
                continue
            stop = min(end, offsets[mq] + 64)
            batches, nxt = client.read_batches(mq, offsets[mq], stop, expression=args.expression)
            for b in batches:
                for row in b.to_pylist():
                    print(
                        json.dumps(
                            {
                                "broker": row["brokerName"],
                                "queue": row["queueId"],
                                "offset": row["queueOffset"],
                                "msgId": row["msgId"],
                                "tags": row["tags"],
                                "keys": row["keys"] or [],
                                "body": row["body"].decode("utf-8", "backslashreplace"),
                                "storeTimestamp": int(row["storeTimestamp"].timestamp() * 1000),
                                "reconsumeTimes": row["reconsumeTimes"],
                            },
                            ensure_ascii=False,
                        ),
                        file=out,
                    )
                    shown += 1
                    if args.max and shown >= args.max:
                        nxt = row["queueOffset"] + 1
                        break
                if args.max and shown >= args.max:
                    break
            if args.follow:
                out.flush()  # a pipe holds lines back until its buffer fills
            moved = moved or nxt != offsets[mq]
            read += max(0, nxt - offsets[mq])
            offsets[mq] = nxt
            bar.update(read)
            if args.group:
                client.commit_offsets(args.group, {mq: nxt})
            if args.max and shown >= args.max:
                return 0
        if not args.follow and not moved:
            return 0
        if not moved:
            time.sleep(0.2)


def group_offsets(args: argparse.Namespace, out: TextIO, table: Any) -> int:
    if not args.topic:
        raise ConfigError("group offsets on a cluster needs --topic (its brokers are asked)")
    client = connect(args)
    rows = []
    for mq in client.queues(args.topic):
        committed = client.committed_offset(args.group, mq)
        high = client.max_offset(mq)
        low = client.min_offset(mq) if committed is None else committed
        rows.append(
            (
                mq.topic,
                f"{mq.broker}/{mq.queue_id}",
                "-" if committed is None else committed,
                high,
                high - low,
            )
        )
    table(out, ["topic", "queue", "committed", "max", "lag"], rows)
    print(f"total lag: {sum(r[4] for r in rows)}", file=out)
    return 0


def query(args: argparse.Namespace, out: TextIO) -> int:
    client = connect(args)
    found = client.query_by_key(args.topic, args.key)
    begin, end = args.begin_ms, args.end_ms
    found = [
        m for m in found if m.store_timestamp >= begin and (end is None or m.store_timestamp <= end)
    ]
    for m in found:
        print(
            json.dumps(
                {
                    "queue": m.queue_id,
                    "offset": m.queue_offset,
                    "msgId": m.msg_id,
                    "keys": m.keys,
                    "uniqKey": m.uniq_key,
                    "body": m.body.decode("utf-8", "backslashreplace"),
                    "storeTimestamp": m.store_timestamp,
                },
                ensure_ascii=False,
            ),
            file=out,
        )
    print(f"{len(found)} message(s)", file=out)
    return 0
