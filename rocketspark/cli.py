"""The ``rocketspark`` command: what an operator does with a store.

    rocketspark [--store DIR] [--config broker.conf] [--[no-]progress] COMMAND ...
    rocketspark --version

    topic create NAME [--queues N] [--order] [--force]
                            (an existing topic: more queues, or fewer only where the
                             queues dropped hold no messages, unless --force)
    topic list
    send TOPIC [BODY | --body-file PATH|-] [--tags T] [--keys K ...] [--property k=v ...]
                    [--queue Q] [--sharding-key S] [--delay-level L]
                            (without --queue or --sharding-key: a queue at random, as
                             RocketMQ's producer starts its round-robin)
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
Long scans (store check, tail) show progress with a rate and an ETA on stderr when
it is a terminal (--progress: always, --no-progress: never).
Exit status: see EXIT_STATUS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rocketspark import __version__, cli_cluster
from rocketspark.errors import RocketSparkError, StorePathError, UsageError

EXIT_STATUS = """\
exit status:
  0    done (store check: nothing wrong found)
  1    store check found a problem, store recover left the store damaged
       (read-only), or an I/O error (a path that is a file, no permission, a full disk)
  2    bad usage or input: a wrong option, or a rocketspark error such as an unknown
       topic, a queue the topic does not have, a body file that cannot be read
  130  interrupted (Ctrl-C)
  141  the reader of the output went away (`rocketspark tail T | head`)"""

STORE_DIRECTORY = """\
the store directory: --store DIR, else $ROCKETSPARK_STORE, else storePathRootDir of
the broker.conf given with --config (default conf/broker.conf). Only `topic create`
makes a new store; every other command needs one there."""

# tail --group commits the offsets it printed at most this often, and when it ends:
# a commit is a durable write, and one per pull made long tails crawl.
GROUP_COMMIT_INTERVAL_S = 1.0


class Progress:
    """One line of progress on stderr: done / total, rate and ETA.

    Shown where someone watches: when the stream is a terminal, or when forced
    (``--progress``); then, on a stream that is not a terminal, a plain line every
    few seconds instead of one line redrawn. ``unit`` "B" shows sizes in KiB/MiB/GiB,
    anything else counts (``messages``, ``entries``). Past ``total`` (a tail that
    follows new messages) it shows the count and the rate, with no ETA.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        force: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = max(total, 0)
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        tty = _isatty(self.stream)
        self.enabled = tty if force is None else force
        self._redraw = tty
        self._interval = 0.2 if tty else 5.0
        self._clock = clock
        self._start = clock()
        self._last = self._start
        self._done = 0
        self._width = 0

    def update(self, done: int) -> None:
        """Record that ``done`` units are done; redraw at most every 0.2 s (5 s off a terminal)."""
        self._done = done
        if not self.enabled:
            return
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            self._show(self.line(now))

    def close(self) -> None:
        """Show the final count, rate and time taken; end the line."""
        if not self.enabled:
            return
        now = self._clock()
        if self._done < self.total:  # it ended short of an estimate: what it did is all
            self.total = self._done
        self._show(self.line(now, final=True))
        if self._redraw:
            self.stream.write("\n")
            self.stream.flush()

    def line(self, now: float, *, final: bool = False) -> str:
        """The text shown at ``now``."""
        done, total = self._done, self.total
        elapsed = max(now - self._start, 1e-9)
        rate = done / elapsed
        parts = [self.label]
        if total and done <= total:
            frac = done / total
            filled = int(frac * _BAR_WIDTH)
            parts.append(f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {frac * 100:5.1f}%")
            parts.append(f"{self._amount(done)}/{self._amount(total)}{self._suffix()}")
        else:
            parts.append(f"{self._amount(done)}{self._suffix()}")
        parts.append(f"{self._amount(rate)}{self._suffix()}/s" if done else "-/s")
        if final:
            parts.append(f"in {_duration(elapsed)}")
        elif total and done < total:
            parts.append(f"ETA {_duration((total - done) / rate)}" if done else "ETA -")
        return "  ".join(parts)

    def _amount(self, n: float) -> str:
        if self.unit == "B":
            for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
                if n >= scale:
                    return f"{n / scale:.1f} {name}"
            return f"{n:.0f} B"
        return f"{n:,.0f}"

    def _suffix(self) -> str:
        return "" if self.unit in ("", "B") else f" {self.unit}"

    def _show(self, text: str) -> None:
        if self._redraw:  # pad over what is left of a longer line before
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


_BAR_WIDTH = 20


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed stream
        return False


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


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


def _body(args: argparse.Namespace) -> bytes:
    """The message body: BODY as typed, or the bytes of --body-file (``-``: stdin)."""
    if args.body is None and args.body_file is None:
        raise UsageError("send needs a BODY, or --body-file PATH (- for stdin)")
    if args.body is not None and args.body_file is not None:
        raise UsageError("send takes a BODY or --body-file, not both")
    if args.body is not None:
        # the bytes typed, even when they are not UTF-8 (Python decoded argv with
        # surrogateescape)
        return os.fsencode(args.body)
    if args.body_file == "-":
        return sys.stdin.buffer.read()
    try:
        with open(args.body_file, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"--body-file {args.body_file}: {exc.strerror or exc}") from None


def cmd_send(args, out) -> int:
    from rocketspark.store import Message

    props = {}
    for item in args.property or []:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"rocketspark send: --property {item!r}: expected name=value", file=sys.stderr)
            return 2
        props[name] = value
    body = _body(args)
    if args.namesrv:
        return cli_cluster.send(args, out, body, props)
    with _open(args) as store:
        queue = args.queue
        if queue is None and args.sharding_key is None and store.has_topic(args.topic):
            # A producer starts its round-robin at a random queue; the store's own starts
            # at 0 in every process, and each send is a process of its own.
            queues = store.topic(args.topic).write_queue_nums
            queue = random.randrange(queues) if queues > 0 else None
        # Message refuses an empty body, the store a delay level it lacks and a queue
        # the topic does not have
        msg = Message(
            args.topic,
            body,
            tags=args.tags,
            keys=tuple(args.keys or ()),
            properties=props,
            queue_id=queue,
            sharding_key=args.sharding_key,
            delay_level=args.delay_level,
        )
        r = store.put(msg)
    print(
        f"{r.status.value} topic={r.topic} queue={r.queue_id} offset={r.queue_offset} "
        f"msgId={r.msg_id} uniqKey={r.uniq_key}",
        file=out,
    )
    return 0


def _tail_progress(args: argparse.Namespace, out: TextIO, available: int) -> Progress:
    """Progress of a tail, in queue offsets read of those there when it started: by
    default shown on a terminal's stderr while the messages go elsewhere (a file, a
    pipe); on the terminal, the messages show it themselves."""
    total = min(available, args.max) if args.max and args.expression == "*" else available
    show = args.progress
    if show is None:
        show = _isatty(sys.stderr) and not _isatty(out)
    return Progress(total, f"tail {args.topic}", unit="messages", force=show)


def cmd_tail(args, out) -> int:
    from rocketspark.store import PullStatus

    if args.group:  # before anything is read (and printed)
        from rocketspark.message.names import validate_group

        validate_group(args.group)
    if args.namesrv:
        return cli_cluster.tail(args, out, lambda n: _tail_progress(args, out, n))
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
        bar = _tail_progress(
            args, out, sum(max(0, store.max_offset(args.topic, q) - offsets[q]) for q in queues)
        )
        uncommitted: dict[tuple[str, int], int] = {}

        def commit() -> None:
            if uncommitted:
                # What is committed must have been written: lines still in stdout's buffer
                # (a pipe or a file) are not yet seen, and a failed flush commits nothing.
                out.flush()
                store.commit_offsets(args.group, uncommitted)
                uncommitted.clear()

        def read_on() -> None:
            shown = read = 0
            committed_at = time.monotonic()
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
                        if args.group:  # a Ctrl-C from here on commits this line too
                            uncommitted[(args.topic, q)] = m.queue_offset + 1
                        shown += 1
                        if args.max and shown >= args.max:
                            nxt = m.queue_offset + 1  # the group has seen no further
                            break
                    moved = moved or nxt != offsets[q]
                    read += max(0, nxt - offsets[q])
                    offsets[q] = nxt
                    bar.update(read)
                    if args.group:
                        uncommitted[(args.topic, q)] = nxt
                        if time.monotonic() - committed_at >= GROUP_COMMIT_INTERVAL_S:
                            commit()
                            committed_at = time.monotonic()
                    if args.follow and res.messages:
                        # after the bookkeeping: a reader that saw these lines and stops
                        # us at once finds them committed
                        out.flush()  # a pipe holds lines back until its buffer fills
                    if args.max and shown >= args.max:
                        return
                if not args.follow and not moved:
                    return

        try:
            read_on()
        except KeyboardInterrupt:  # Ctrl-C ends --follow: what was printed counts as seen
            commit()
            raise
        finally:
            bar.close()
        # not after an error: a pipe that broke may have lost what was printed
        commit()
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
    report = check_store(
        path,
        progress=lambda total, what, unit: Progress(
            total, f"checking {what}", unit=unit, force=args.progress
        ),
    )
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


def _command(
    sub: Any, name: str, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A command's parser; its --help ends with the exit status."""
    return sub.add_parser(
        name,
        help=help,
        description=textwrap.fill(description or help[:1].upper() + help[1:] + ".", 80),
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rocketspark",
        description="Operate a rocketspark store (a RocketMQ store directory), or a\n"
        "RocketMQ cluster with --namesrv.",
        epilog=f"{STORE_DIRECTORY}\n\n{EXIT_STATUS}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rocketspark {__version__}")
    p.add_argument(
        "--store",
        metavar="DIR",
        help="store directory (default: $ROCKETSPARK_STORE, else "
        "storePathRootDir of the broker.conf)",
    )
    p.add_argument(
        "--config",
        metavar="BROKER_CONF",
        help="broker.conf to read (default conf/broker.conf if present)",
    )
    p.add_argument(
        "--namesrv",
        metavar="HOST:PORT[;HOST:PORT]",
        help="a RocketMQ cluster's NameServers instead of a store (topic, send, tail, "
        "group offsets, query)",
    )
    p.add_argument(
        "--access-key", metavar="KEY", help="ACL access key (default $ROCKETMQ_ACCESS_KEY)"
    )
    p.add_argument(
        "--secret-key", metavar="KEY", help="ACL secret key (default $ROCKETMQ_SECRET_KEY)"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress of long scans (store check, tail) on stderr, with a rate and an "
        "ETA (default: when stderr is a terminal; for tail, when stdout is not)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topic = sub.add_parser("topic", help="create and list topics")
    tsub = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = _command(
        tsub,
        "create",
        "create a topic, or change its queue count",
        "Create a topic (making the store if there is none yet), or change the queue "
        "count of an existing one: more queues, or fewer only where the queues dropped "
        "hold no messages, unless --force.",
    )
    c.add_argument("name", metavar="NAME", help="topic name (letters, digits, %%, -, _ and |)")
    c.add_argument(
        "--queues",
        type=int,
        metavar="N",
        help="number of queues (default: defaultTopicQueueNums of the broker.conf, "
        "4 unless set; 8 on a cluster)",
    )
    c.add_argument(
        "--order",
        action="store_true",
        help="mark the topic ordered (topics.json's order flag); senders keep an order "
        "with --sharding-key",
    )
    c.add_argument(
        "--force",
        action="store_true",
        help="allow fewer queues than the topic has even where they hold messages "
        "(those messages are no longer read)",
    )
    c.set_defaults(func=cmd_topic_create)
    _command(tsub, "list", "list the topics with their queue and message counts").set_defaults(
        func=cmd_topic_list
    )

    s = _command(
        sub,
        "send",
        "put one message",
        "Put one message. The body is BODY as typed, or the bytes of --body-file "
        "(- reads stdin: no limit of the shell's argument length).",
    )
    s.add_argument("topic", metavar="TOPIC", help="topic to put it on")
    s.add_argument("body", nargs="?", metavar="BODY", help="the message body (or --body-file)")
    s.add_argument(
        "--body-file",
        metavar="PATH",
        help="read the body from this file, byte for byte; - reads stdin",
    )
    s.add_argument(
        "--tags",
        metavar="TAG",
        help="the message's tag (TAGS), what consumers and `tail --expression` filter on",
    )
    s.add_argument(
        "--keys",
        nargs="*",
        metavar="KEY",
        help="keys (KEYS) to find it by with `query`",
    )
    s.add_argument(
        "--property",
        action="append",
        metavar="NAME=VALUE",
        help="a user property (repeat for more)",
    )
    s.add_argument(
        "--queue",
        type=_non_negative(int),
        metavar="Q",
        help="put it on queue Q (default: with --sharding-key its hash, else a queue at "
        "random, as RocketMQ's producer starts its round-robin); on a cluster, the Q-th "
        "of the topic's writable queues over its brokers",
    )
    s.add_argument(
        "--sharding-key",
        metavar="S",
        help="choose the queue by the hash of S (RocketMQ's SelectMessageQueueByHash): "
        "messages with one key stay in one queue, in order",
    )
    s.add_argument(
        "--delay-level",
        type=_non_negative(int),
        default=0,
        metavar="L",
        help="deliver it after delay level L of messageDelayLevel (1s 5s 10s 30s 1m ...; "
        "default 0: now); on a store, `schedule run` delivers what is due",
    )
    s.set_defaults(func=cmd_send)

    t = _command(
        sub,
        "tail",
        "print the messages of a topic (optionally as a group)",
        "Print the messages of a topic, one JSON object a line. With --group it starts "
        "from the group's offsets and commits what it printed (at least once a second, "
        "and when it ends). Without --follow it ends at the queues' ends.",
    )
    t.add_argument("topic", metavar="TOPIC", help="topic to read")
    t.add_argument(
        "--queue",
        type=_non_negative(int),
        metavar="Q",
        help="only queue Q (default: every queue; on a cluster, queue Q of every broker)",
    )
    t.add_argument(
        "--from",
        dest="start",
        type=_start_position,
        default=None,
        metavar="WHERE",
        help="earliest, latest, group or an offset (default: group with --group, else earliest)",
    )
    t.add_argument("--group", help="commit offsets for this consumer group as it reads")
    t.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    t.add_argument(
        "--max",
        type=_non_negative(int),
        default=0,
        metavar="N",
        help="stop after this many messages (default 0: no limit)",
    )
    t.add_argument("--follow", action="store_true", help="keep waiting for new messages")
    t.set_defaults(func=cmd_tail)

    g = sub.add_parser("group", help="consumer group offsets and lag")
    gsub = g.add_subparsers(dest="action", required=True, metavar="ACTION")
    o = _command(
        gsub,
        "offsets",
        "show a group's committed offsets and lag per queue",
    )
    o.add_argument("group", metavar="GROUP", help="consumer group")
    o.add_argument("--topic", help="only this topic (needed on a cluster)")
    o.set_defaults(func=cmd_group_offsets)

    q = _command(
        sub,
        "query",
        "find messages by key or UNIQ_KEY",
        "Find the messages (up to 64, newest first) whose KEYS or UNIQ_KEY is KEY, "
        "through the index files.",
    )
    q.add_argument("topic", metavar="TOPIC", help="topic to search")
    q.add_argument("key", metavar="KEY", help="a key the message was sent with, or its UNIQ_KEY")
    q.add_argument(
        "--begin-ms",
        type=_non_negative(int),
        default=0,
        metavar="MS",
        help="only messages stored at or after this time (ms since the epoch)",
    )
    q.add_argument(
        "--end-ms",
        type=_non_negative(int),
        metavar="MS",
        help="only messages stored at or before this time (ms since the epoch)",
    )
    q.set_defaults(func=cmd_query)

    sch = sub.add_parser("schedule", help="delay levels")
    schsub = sch.add_subparsers(dest="action", required=True, metavar="ACTION")
    _command(
        schsub,
        "run",
        "deliver due delayed messages",
        "Deliver the delayed messages that are due to their topics (an embedded store "
        "has no broker daemon to do it).",
    ).set_defaults(func=cmd_schedule_run)

    # serve has a parser of its own (cli_serve): its arguments are handed over as they are
    serve = sub.add_parser(
        "serve",
        help="serve a store as a RocketMQ NameServer and broker (see serve --help)",
        add_help=False,
    )
    serve.set_defaults(func=cmd_serve)

    st = sub.add_parser("store", help="check, recover or clean a store directory")
    stsub = st.add_subparsers(dest="action", required=True, metavar="ACTION")
    store_dir = "the store directory (default: --store, $ROCKETSPARK_STORE)"
    ck = _command(
        stsub,
        "check",
        "verify every record and ConsumeQueue entry, read-only",
        "Verify the store without changing it: every CommitLog record (CRC included), "
        "every ConsumeQueue entry against its record, the files' sizes and "
        "rocketspark.state. Exit status 1 when it finds a problem.",
    )
    ck.add_argument("dir", nargs="?", metavar="DIR", help=store_dir)
    ck.set_defaults(func=cmd_store_check)
    rc = _command(
        stsub,
        "recover",
        "recover the store in full and report what it did",
        "Open the store, recovering it in full (the whole CommitLog, every "
        "ConsumeQueue), and report what it did: a torn tail discarded, ConsumeQueues "
        "rebuilt. A damaged CommitLog leaves the store read-only (exit status 1) until "
        "--truncate-at discards it from the damage on.",
    )
    rc.add_argument("dir", nargs="?", metavar="DIR", help=store_dir)
    rc.add_argument(
        "--truncate-at",
        type=_non_negative(int),
        default=None,
        metavar="OFFSET",
        help="discard the CommitLog from this offset on: the damage offset a "
        "recovery or `store check` reported (valid records after it go too)",
    )
    rc.set_defaults(func=cmd_store_recover)
    cl = _command(
        stsub,
        "clean",
        "delete expired segments (fileReservedTime)",
        "Delete CommitLog segments older than fileReservedTime and the ConsumeQueue and "
        "index files that only point into them.",
    )
    cl.add_argument("dir", nargs="?", metavar="DIR", help=store_dir)
    cl.add_argument(
        "--reserved-hours",
        type=_non_negative(float),
        default=None,
        metavar="H",
        help="keep segments younger than this (default: fileReservedTime)",
    )
    cl.set_defaults(func=cmd_store_clean)
    return p


def cmd_serve(args, out) -> int:
    from rocketspark import cli_serve

    argv = list(args.serve_args)
    if args.store and "--store" not in argv:  # rocketspark --store DIR serve ...
        argv = ["--store", args.store, *argv]
    if args.config and "--config" not in argv:
        argv = ["--config", args.config, *argv]
    return cli_serve.main(argv, out)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        args.serve_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
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
