"""The ``rocketspark`` command: what an operator does with a store.

    rocketspark [--store DIR] [--config broker.conf] COMMAND ...

    topic create NAME [--queues N] [--order] [--force]
                            (an existing topic: more queues, or fewer only where the
                             queues dropped hold no messages, unless --force)
    topic list
    send TOPIC BODY [--tags T] [--keys K ...] [--property k=v ...] [--queue Q]
                    [--sharding-key S] [--delay-level L]
    tail TOPIC [--queue Q] [--from earliest|latest|group|N] [--group G] [--expression E]
               [--max N] [--follow]     (with --group: from the group's offsets, and
                                         commits what it printed)
    group offsets GROUP [--topic T]
    query TOPIC KEY [--begin-ms MS] [--end-ms MS]
    schedule run
    store check [DIR]       read-only: verify every record and ConsumeQueue entry
    store recover [DIR] [--truncate-at OFFSET]
                            open the store, recovering it in full (the whole CommitLog,
                            every ConsumeQueue), and report what it did; --truncate-at
                            discards the CommitLog from a reported damage on
    store clean [DIR] [--reserved-hours H]
                            delete CommitLog segments older than fileReservedTime and
                            the ConsumeQueue / index files that only point into them

With --namesrv HOST:PORT[;HOST:PORT] (and --access-key / --secret-key for ACL) the
topic, send, tail, group offsets and query commands work on a RocketMQ cluster
(rocketspark/cli_cluster.py).

The store directory comes from --store, else $ROCKETSPARK_STORE, else the
storePathRootDir of the broker.conf given with --config (or conf/broker.conf).
Only ``topic create`` makes a new store there; other commands need one.
Exit status: 0 fine, 1 a problem found (check; recover: a damaged store left read-only),
2 bad usage or a rocketspark error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rocketspark import cli_cluster
from rocketspark.errors import RocketSparkError, StorePathError


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, or forced)."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, force: bool = False):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self._last = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        self.stream.write(f"\r{self.label} [{bar}] {frac * 100:5.1f}%")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.total)
            self.stream.write("\n")


def _store_dir(args: argparse.Namespace) -> str | None:
    return getattr(args, "dir", None) or args.store or os.environ.get("ROCKETSPARK_STORE")


def _open(args: argparse.Namespace, *, create: bool = False, **kw: Any):
    """Open the store; only ``topic create`` makes a new one (a typo'd path is an error)."""
    from rocketspark.store import MessageStore, MessageStoreConfig
    from rocketspark.store.layout import directory_kind

    path = _store_dir(args)
    if not create:
        root = os.path.abspath(path or MessageStoreConfig.load(args.config).store_path_root_dir)
        if directory_kind(root) != "store":
            raise StorePathError(
                f"no store at {root} (give --store DIR; `rocketspark --store "
                "DIR topic create NAME` makes a new store)",
                path=root,
            )
    # topic create makes a store only where nothing is, or an empty directory.
    return MessageStore.open(path, config_file=args.config, create=None if create else False, **kw)


def cmd_topic_create(args, out) -> int:
    if args.namesrv:
        return cli_cluster.topic_create(args, out)
    with _open(args, create=True) as store:
        info = store.create_topic(args.name, args.queues, order=args.order, force=args.force)
    print(f"topic {info.name}: {info.write_queue_nums} queues", file=out)
    return 0


def cmd_topic_list(args, out) -> int:
    if args.namesrv:
        return cli_cluster.topic_list(args, out, _table)
    with _open(args) as store:
        rows = []
        for info in store.list_topics():
            total = sum(store.max_offset(info.name, q) for q in range(info.read_queue_nums))
            rows.append((info.name, info.read_queue_nums, total))
    _table(out, ["topic", "queues", "messages"], rows)
    return 0


def cmd_send(args, out) -> int:
    from rocketspark.store import Message

    props = {}
    for item in args.property or []:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"rocketspark send: --property {item!r}: expected name=value", file=sys.stderr)
            return 2
        props[name] = value
    if args.namesrv:
        return cli_cluster.send(args, out, props)
    # the bytes typed, even when they are not UTF-8 (Python decoded argv with
    # surrogateescape); Message refuses an empty body, the store a delay level it lacks
    msg = Message(
        args.topic,
        os.fsencode(args.body),
        tags=args.tags,
        keys=tuple(args.keys or ()),
        properties=props,
        queue_id=args.queue,
        sharding_key=args.sharding_key,
        delay_level=args.delay_level,
    )
    with _open(args) as store:
        r = store.put(msg)
    print(
        f"{r.status.value} topic={r.topic} queue={r.queue_id} offset={r.queue_offset} "
        f"msgId={r.msg_id} uniqKey={r.uniq_key}",
        file=out,
    )
    return 0


def cmd_tail(args, out) -> int:
    from rocketspark.store import PullStatus

    if args.group:  # before anything is read (and printed)
        from rocketspark.message.names import validate_group

        validate_group(args.group)
    if args.namesrv:
        return cli_cluster.tail(args, out)
    with _open(args) as store:
        info = store.topic(args.topic)
        queues = [args.queue] if args.queue is not None else list(range(info.read_queue_nums))
        start = args.start or ("group" if args.group else "earliest")
        offsets = {}
        for q in queues:
            if start == "group":
                offsets[q] = store.committed_offset(args.group, args.topic, q) or store.min_offset(
                    args.topic, q
                )
            elif start == "earliest":
                offsets[q] = store.min_offset(args.topic, q)
            elif start == "latest":
                offsets[q] = store.max_offset(args.topic, q)
            else:
                offsets[q] = int(start)
        shown = 0
        while True:
            moved = False  # messages shown, or offsets stepped (filtered, or cleaned away)
            for q in queues:
                res = store.pull(
                    args.topic,
                    q,
                    offsets[q],
                    max_msgs=64,
                    expression=args.expression,
                    timeout_ms=100 if args.follow else 0,
                )
                if res.status is PullStatus.OFFSET_ILLEGAL:
                    print(
                        f"# queue {q}: offset {offsets[q]} out of range "
                        f"[{res.min_offset}, {res.max_offset}], moving to {res.next_offset}",
                        file=out,
                    )
                nxt = res.next_offset
                for m in res.messages:
                    print(
                        json.dumps(
                            {
                                "queue": m.queue_id,
                                "offset": m.queue_offset,
                                "msgId": m.msg_id,
                                "tags": m.tags,
                                "keys": m.keys,
                                "body": m.body.decode("utf-8", "backslashreplace"),
                                "storeTimestamp": m.store_timestamp,
                                "reconsumeTimes": m.reconsume_times,
                            },
                            ensure_ascii=False,
                        ),
                        file=out,
                    )
                    shown += 1
                    if args.max and shown >= args.max:
                        nxt = m.queue_offset + 1  # the group has seen no further
                        break
                moved = moved or nxt != offsets[q]
                offsets[q] = nxt
                if args.group:
                    store.commit_offset(args.group, args.topic, q, offsets[q])
                if args.max and shown >= args.max:
                    return 0
            if not args.follow and not moved:
                return 0


def cmd_group_offsets(args, out) -> int:
    if args.namesrv:
        return cli_cluster.group_offsets(args, out, _table)
    with _open(args) as store:
        rows = []
        for (t, q), lag in store.lag(args.group, args.topic).items():
            committed = store.committed_offset(args.group, t, q)
            rows.append(
                (t, q, "-" if committed is None else committed, store.max_offset(t, q), lag)
            )
    _table(out, ["topic", "queue", "committed", "max", "lag"], rows)
    if rows:
        print(f"total lag: {sum(r[4] for r in rows)}", file=out)
    else:
        print(f"group {args.group!r} has committed no offsets", file=out)
    return 0


def cmd_query(args, out) -> int:
    if args.namesrv:
        return cli_cluster.query(args, out)
    with _open(args) as store:
        found = store.query_by_key(args.topic, args.key, args.begin_ms, args.end_ms)
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


def cmd_schedule_run(args, out) -> int:
    with _open(args) as store:
        n = store.run_schedule()
    print(f"delivered {n} due message(s)", file=out)
    return 0


def cmd_store_check(args, out) -> int:
    from rocketspark.store.store_check import check_store

    path = _store_dir(args)
    if not path:
        print("rocketspark store check: give the store directory (or --store)", file=sys.stderr)
        return 2
    report = check_store(path, progress=lambda total: Progress(total, "checking"))
    print(report.render(), file=out)
    return 0 if report.ok else 1


def cmd_store_recover(args, out) -> int:
    with _open(args, truncate_at=args.truncate_at, full_recovery=True) as store:
        rep = store.recovery_report
    if rep is None:
        print("the store is open in another process; it was recovered when first opened", file=out)
        return 0
    if rep.state_damaged:
        print(
            f"rocketspark.state was not trusted (checks failed: "
            f"{', '.join(rep.state_damaged)}); rebuilt from the CommitLog",
            file=out,
        )
    if rep.scanned_from is None:
        print(f"clean: the last shutdown was orderly; CommitLog ends at {rep.commit_end}", file=out)
    else:
        print(
            f"{'abnormal exit found; ' if rep.abnormal_exit else ''}scanned the CommitLog "
            f"from {rep.scanned_from} to {rep.commit_end}",
            file=out,
        )
    if rep.reason:
        print(f"  the data ends at {rep.commit_end}: {rep.reason}", file=out)
    if rep.truncated_valid_records:
        print(
            f"  truncated at {rep.commit_end} as asked: discarded "
            f"{rep.truncated_valid_records} valid record(s) after the damage",
            file=out,
        )
    if rep.discarded_bytes:
        print(f"  discarded {rep.discarded_bytes} bytes of torn tail", file=out)
    if rep.truncated_queue_entries:
        print(
            f"  removed {rep.truncated_queue_entries} ConsumeQueue entries past the end", file=out
        )
    for topic, qid, first, now in rep.repaired_queues:
        print(
            f"  rebuilt ConsumeQueue {topic}/{qid} from entry {first} (a hole); it has "
            f"{now} entries",
            file=out,
        )
    if rep.damage is not None:
        print(f"DAMAGED: {rep.damage.describe()}", file=out)
        return 1
    return 0


def cmd_store_clean(args, out) -> int:
    with _open(args) as store:
        hours = (
            store.config.file_reserved_time if args.reserved_hours is None else args.reserved_hours
        )
        done = store.delete_expired(reserved_hours=hours)
        print(
            f"deleted {done['commitlog']} CommitLog segment(s) older than {hours:g} h, "
            f"{done['consumequeue']} ConsumeQueue file(s) and {done['index']} index "
            f"file(s); the CommitLog now starts at {store.commit_log.min_offset}",
            file=out,
        )
    return 0


def _table(out: TextIO, header: list[str], rows: list[tuple]) -> None:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip(), file=out)


def _start_position(text: str) -> str:
    if text in ("earliest", "latest", "group") or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected earliest, latest, group or an offset, got {text!r}")


def _non_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rocketspark", description="Operate a rocketspark store.")
    p.add_argument("--store", help="store directory (storePathRootDir)")
    p.add_argument("--config", help="broker.conf to read (default conf/broker.conf if present)")
    p.add_argument(
        "--namesrv",
        metavar="HOST:PORT[;HOST:PORT]",
        help="a RocketMQ cluster's NameServers instead of a store (topic, send, tail, "
        "group offsets, query)",
    )
    p.add_argument("--access-key", help="ACL access key (default $ROCKETMQ_ACCESS_KEY)")
    p.add_argument("--secret-key", help="ACL secret key (default $ROCKETMQ_SECRET_KEY)")
    sub = p.add_subparsers(dest="command", required=True)

    topic = sub.add_parser("topic", help="create and list topics")
    tsub = topic.add_subparsers(dest="action", required=True)
    c = tsub.add_parser("create")
    c.add_argument("name")
    c.add_argument("--queues", type=int)
    c.add_argument("--order", action="store_true")
    c.add_argument(
        "--force",
        action="store_true",
        help="allow fewer queues than the topic has even where they hold messages "
        "(those messages are no longer read)",
    )
    c.set_defaults(func=cmd_topic_create)
    tsub.add_parser("list").set_defaults(func=cmd_topic_list)

    s = sub.add_parser("send", help="put one message")
    s.add_argument("topic")
    s.add_argument("body")
    s.add_argument("--tags")
    s.add_argument("--keys", nargs="*")
    s.add_argument("--property", action="append", metavar="NAME=VALUE")
    s.add_argument("--queue", type=int)
    s.add_argument("--sharding-key")
    s.add_argument("--delay-level", type=int, default=0)
    s.set_defaults(func=cmd_send)

    t = sub.add_parser("tail", help="print the messages of a topic (optionally as a group)")
    t.add_argument("topic")
    t.add_argument("--queue", type=int)
    t.add_argument(
        "--from",
        dest="start",
        type=_start_position,
        default=None,
        help="earliest, latest, group or an offset (default: group with --group, else earliest)",
    )
    t.add_argument("--group", help="commit offsets for this consumer group as it reads")
    t.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    t.add_argument(
        "--max", type=_non_negative(int), default=0, help="stop after this many messages"
    )
    t.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    t.set_defaults(func=cmd_tail)

    g = sub.add_parser("group", help="consumer group offsets and lag")
    gsub = g.add_subparsers(dest="action", required=True)
    o = gsub.add_parser("offsets")
    o.add_argument("group")
    o.add_argument("--topic")
    o.set_defaults(func=cmd_group_offsets)

    q = sub.add_parser("query", help="find messages by key or UNIQ_KEY")
    q.add_argument("topic")
    q.add_argument("key")
    q.add_argument("--begin-ms", type=int, default=0)
    q.add_argument("--end-ms", type=int)
    q.set_defaults(func=cmd_query)

    sch = sub.add_parser("schedule", help="delay levels")
    schsub = sch.add_subparsers(dest="action", required=True)
    schsub.add_parser("run", help="deliver due delayed messages").set_defaults(
        func=cmd_schedule_run
    )

    st = sub.add_parser("store", help="check, recover or clean a store directory")
    stsub = st.add_subparsers(dest="action", required=True)
    ck = stsub.add_parser("check")
    ck.add_argument("dir", nargs="?")
    ck.set_defaults(func=cmd_store_check)
    rc = stsub.add_parser("recover")
    rc.add_argument("dir", nargs="?")
    rc.add_argument(
        "--truncate-at",
        type=_non_negative(int),
        default=None,
        metavar="OFFSET",
        help="discard the CommitLog from this offset on: the damage offset a "
        "recovery or `store check` reported (valid records after it go too)",
    )
    rc.set_defaults(func=cmd_store_recover)
    cl = stsub.add_parser("clean", help="delete expired segments (fileReservedTime)")
    cl.add_argument("dir", nargs="?")
    cl.add_argument(
        "--reserved-hours",
        type=_non_negative(float),
        default=None,
        help="keep segments younger than this (default: fileReservedTime)",
    )
    cl.set_defaults(func=cmd_store_clean)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "start", None) == "group" and not args.group:
        parser.error("tail --from group needs --group")
    out = out or sys.stdout
    if getattr(args, "dir", None):
        args.store = args.dir
    if args.namesrv and args.command in ("schedule", "store"):
        parser.error(f"{args.command} works on a store directory, not on --namesrv")
    if args.namesrv and args.store:
        parser.error("--store and --namesrv exclude each other")
    try:
        return args.func(args, out)
    except RocketSparkError as exc:
        print(f"rocketspark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C ends tail --follow: not an error worth a trace
        return 130
    except BrokenPipeError:  # `rocketspark tail T | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141
    except OSError as exc:  # a store path that is a file, no permission, a full disk
        print(f"rocketspark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
