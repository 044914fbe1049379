"""The `rocketspark` command, run as a real process against a real store."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import threading

import rocketspark
from rocketspark import cli_serve
from rocketspark.cli import Progress, build_parser, main
from rocketspark.store import Message, MessageStore


def _cli(store: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocketspark.cli", "--store", store, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, ROCKETSPARK_STORE=""),
    )


def test_topics_send_tail_group_and_query(tmp_path):
    store = str(tmp_path / "s")
    r = _cli(store, "topic", "create", "orders", "--queues", "2")
    assert r.returncode == 0 and "topic orders: 2 queues" in r.stdout, r.stderr
    for i in range(4):
        r = _cli(
            store,
            "send",
            "orders",
            f"body-{i}",
            "--tags",
            "created",
            "--keys",
            f"o-{i}",
            "--property",
            "k=v",
            "--queue",
            str(i % 2),
        )
        assert r.returncode == 0 and r.stdout.startswith("PUT_OK topic=orders"), r.stderr
    r = _cli(store, "topic", "list")
    assert any(line.split() == ["orders", "2", "4"] for line in r.stdout.splitlines()), r.stdout
    r = _cli(store, "tail", "orders", "--queue", "1", "--group", "ops")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["offset"], x["body"], x["keys"]) for x in rows] == [
        (0, "body-1", ["o-1"]),
        (1, "body-3", ["o-3"]),
    ]
    r = _cli(store, "group", "offsets", "ops", "--topic", "orders")
    lines = [line.split() for line in r.stdout.splitlines()]
    assert ["orders", "0", "-", "2", "2"] in lines and ["orders", "1", "2", "2", "0"] in lines
    assert "total lag: 2" in r.stdout
    r = _cli(store, "query", "orders", "o-2")
    found = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [f["body"] for f in found] == ["body-2"] and "1 message(s)" in r.stdout
    with MessageStore.open(store) as s:  # what the command wrote is what the store holds
        m = s.pull("orders", 0, 1).messages[0]
        assert (m.body, m.tags, m.properties["k"]) == (b"body-2", "created", "v")
        assert s.committed_offset("ops", "orders", 1) == 2


def test_store_check_finds_a_corrupted_byte_with_its_offset(tmp_path):
    store = str(tmp_path / "s")
    with MessageStore.open(store) as s:
        s.create_topic("orders", queues=1)
        rs = s.put_batch([Message("orders", b"A" * 50) for _ in range(3)])
        second = rs[1].commitlog_offset
    r = _cli(store, "store", "check", store)
    assert r.returncode == 0, r.stdout + r.stderr
    seg = os.path.join(store, "commitlog", "0" * 20)
    with open(seg, "r+b") as f:  # flip a byte inside the second record's body
        f.seek(second + 100)
        b = f.read(1)
        f.seek(second + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    r = _cli(store, "store", "check", store)
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(second) in r.stdout, r.stdout


def test_bad_input_is_a_message_not_a_traceback(tmp_path):
    store = str(tmp_path / "s")
    _cli(store, "topic", "create", "orders")
    r = _cli(store, "send", "nope", "x")
    assert r.returncode == 2 and "topic 'nope' does not exist" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli(store, "topic", "create", "bad/name")
    assert r.returncode == 2 and "illegal characters" in r.stderr
    assert "Traceback" not in r.stderr
    for args, message in [
        (("tail", "orders", "--from", "bogus"), "expected earliest, latest, group or an"),
        (("tail", "orders", "--from", "group"), "tail --from group needs --group"),
        (("tail", "orders", "--max", "-1"), "must not be negative"),
        (("store", "clean", "--reserved-hours", "-5"), "must not be negative"),
        (("send", "orders", "x", "--property", "noeq"), "expected name=value"),
        (("tail", "orders", "--group", "bad group!"), "illegal characters"),
    ]:
        r = _cli(store, *args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    _cli(store, "send", "orders", "printed?")
    r = _cli(store, "tail", "orders", "--group", "bad group!")
    assert r.stdout == ""  # the group name is refused before anything is read
    r = subprocess.run(
        [sys.executable, "-m", "rocketspark.cli", "store", "check"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, ROCKETSPARK_STORE=""),
    )
    assert r.returncode == 2 and "give the store directory" in r.stderr
    afile = tmp_path / "a-file"
    afile.write_text("")
    r = _cli(str(afile), "topic", "create", "orders")
    assert r.returncode == 2 and "StorePathError" in r.stderr and "is a file" in r.stderr
    assert "Traceback" not in r.stderr


def test_tail_reads_on_past_filtered_and_cleaned_offsets_and_stops_quietly_at_a_pipe(tmp_path):
    """Without --follow, tail reads until the queues' ends: a pull that only stepped
    over other tags, or out of a cleaned range, is not the end. A closed pipe ends
    it without a traceback."""
    store = str(tmp_path / "s")
    conf = tmp_path / "broker.conf"  # small CommitLog segments, for the CLI too
    conf.write_text("mappedFileSizeCommitLog=1048576\n")
    with MessageStore.open(store, mappedFileSizeCommitLog=1 << 20) as s:
        s.create_topic("T", queues=1)
        s.put_batch([Message("T", b"b", tags="B") for _ in range(1000)])
        s.put(Message("T", b"the-a", tags="A"))
    r = _cli(store, "--config", str(conf), "tail", "T", "--expression", "A", "--group", "g")
    assert [json.loads(line)["offset"] for line in r.stdout.splitlines()] == [1000], r.stderr
    with MessageStore.open(store, mappedFileSizeCommitLog=1 << 20) as s:
        assert s.committed_offset("g", "T", 0) == 1001
        s.commit_offset("g", "T", 0, 5)
        for i in range(300):
            s.put(Message("T", b"%d" % i + bytes(20_000)))
        s.flush()
        segs = sorted(os.listdir(os.path.join(store, "commitlog")))
        for name in segs[:3]:
            path = os.path.join(store, "commitlog", name)
            t = os.stat(path).st_mtime - 7200
            os.utime(path, (t, t))
        assert s.delete_expired(reserved_hours=1)["commitlog"] == 3
        lo = s.min_offset("T", 0)
    r = _cli(store, "--config", str(conf), "tail", "T", "--group", "g", "--max", "2")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [x["offset"] for x in rows] == [lo, lo + 1], r.stdout
    with MessageStore.open(store, mappedFileSizeCommitLog=1 << 20) as s:
        assert s.committed_offset("g", "T", 0) == lo + 2
    cmd = f"{sys.executable} -m rocketspark.cli --store {store} --config {conf} tail T | head -1"
    r = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cmd}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, ROCKETSPARK_STORE=""),
    )
    assert len(r.stdout.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_only_topic_create_makes_a_store(tmp_path):
    typo = str(tmp_path / "typo")
    for args in (("topic", "list"), ("store", "recover"), ("store", "clean"), ("tail", "orders")):
        r = _cli(typo, *args)
        assert r.returncode == 2 and f"no store at {typo}" in r.stderr, (args, r.stderr)
        assert not os.path.exists(typo)
    assert _cli(typo, "topic", "create", "orders").returncode == 0
    assert _cli(typo, "topic", "list").returncode == 0


def test_tail_as_a_group_resumes_and_commits_only_what_it_printed(tmp_path):
    store = str(tmp_path / "s")
    with MessageStore.open(store) as s:
        s.create_topic("orders", queues=1)
        s.put_batch([Message("orders", f"m{i}".encode()) for i in range(5)])

    def tail(*extra: str) -> list[str]:
        r = _cli(store, "tail", "orders", "--group", "g", *extra)
        assert r.returncode == 0, r.stderr
        return [json.loads(line)["body"] for line in r.stdout.splitlines()]

    assert tail("--max", "2") == ["m0", "m1"]
    assert tail("--max", "1") == ["m2"]  # from the group's offset, not the earliest
    assert tail() == ["m3", "m4"]
    assert tail("--from", "earliest", "--max", "1") == ["m0"]


def test_group_offsets_count_lag_as_the_store_does(tmp_path):
    """A committed offset past the queue's end (a queue re-created smaller) is no
    negative lag."""
    store = str(tmp_path / "s")
    with MessageStore.open(store) as s:
        s.create_topic("T", queues=1)
        s.put(Message("T", b"x"))
        s.commit_offset("g", "T", 0, 50)
        assert s.lag("g") == {("T", 0): 0}
    r = _cli(store, "group", "offsets", "g")
    assert ["T", "0", "50", "1", "0"] in [line.split() for line in r.stdout.splitlines()]
    assert "total lag: 0" in r.stdout, r.stdout


def test_a_directory_that_is_not_a_store_is_refused_and_check_says_so(tmp_path):
    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for args in (
        ("topic", "list"),
        ("topic", "create", "orders"),
        ("send", "t", "x"),
        ("store", "recover"),
    ):
        r = _cli(str(other), *args)
        assert r.returncode == 2 and ("is not a store" in r.stderr or "no store at" in r.stderr), (
            args,
            r.stderr,
        )
        assert "Traceback" not in r.stderr
    assert os.listdir(other) == ["notes.txt"]  # nothing written
    for path in (str(other), "/etc", str(tmp_path / "absent")):
        r = _cli(path, "store", "check", path)
        assert r.returncode == 1 and "not a store" in r.stdout, (path, r.stdout, r.stderr)
        assert "OK" not in r.stdout
    assert os.listdir(other) == ["notes.txt"]


def test_a_truncated_commit_log_is_reported_not_padded(tmp_path):
    store = str(tmp_path / "s")
    with MessageStore.open(store, mappedFileSizeCommitLog=65536) as s:
        s.create_topic("orders", queues=1)
        s.put_batch([Message("orders", b"A" * 50) for _ in range(30)])
    seg = os.path.join(store, "commitlog", "0" * 20)
    for size in (600, 0):
        os.truncate(seg, size)
        for args in (("topic", "list"), ("store", "recover"), ("send", "orders", "x")):
            r = _cli(store, *args)
            assert r.returncode == 2 and "SegmentSizeError" in r.stderr, (args, r.stderr)
            assert f"{seg} is {size} bytes, expected 65536" in r.stderr
        r = _cli(store, "store", "check", store)
        assert r.returncode == 1 and f"{seg} is {size} bytes" in r.stdout, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        assert os.path.getsize(seg) == size


def test_topic_create_shrinks_a_topic_with_messages_only_with_force(tmp_path):
    store = str(tmp_path / "s")
    assert _cli(store, "topic", "create", "orders", "--queues", "8").returncode == 0
    for q in (0, 3, 6):
        assert _cli(store, "send", "orders", f"m{q}", "--queue", str(q)).returncode == 0
    r = _cli(store, "topic", "create", "orders", "--queues", "1")
    assert r.returncode == 2 and "TopicShrinkError" in r.stderr, r.stderr
    assert "'orders' has 8 queues; 1 would hide" in r.stderr and "queue(s) 3, 6," in r.stderr
    assert _cli(store, "topic", "create", "orders", "--queues", "7").returncode == 0
    assert _cli(store, "topic", "create", "orders", "--queues", "12").returncode == 0
    r = _cli(store, "topic", "create", "orders", "--queues", "1", "--force")
    assert r.returncode == 0 and "topic orders: 1 queues" in r.stdout, r.stderr


def _run_main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaf_parsers(child, (*path, name))


def test_help_explains_every_option_and_the_exit_status():
    parser = build_parser()
    leaves = dict(_leaf_parsers(parser))
    assert {" ".join(p) for p in leaves} == {
        "topic create",
        "topic list",
        "send",
        "tail",
        "group offsets",
        "query",
        "schedule run",
        "store check",
        "store recover",
        "store clean",
        "serve",  # its own parser (cli_serve), checked below
    }
    leaves[("serve",)] = cli_serve.build_parser()
    for path, leaf in [((), parser), *leaves.items()]:
        for action in leaf._actions:
            if not isinstance(action, argparse._SubParsersAction):  # its commands have help
                assert action.help, (path, action.option_strings or action.dest)
        if path:
            assert leaf.description, path
            text = leaf.format_help()
            assert "exit status:" in text and ("141" in text or path == ("serve",)), path
    top = parser.format_help()
    assert "$ROCKETSPARK_STORE" in top and "exit status:" in top and "--version" in top
    r = subprocess.run(
        [sys.executable, "-m", "rocketspark.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == f"rocketspark {rocketspark.__version__}"


def test_send_takes_the_body_from_a_file_or_stdin(tmp_path):
    store = str(tmp_path / "s")
    assert _cli(store, "topic", "create", "T", "--queues", "1").returncode == 0
    big = bytes(range(256)) * 512  # 128 KiB, not UTF-8: past what argv should carry
    (tmp_path / "body.bin").write_bytes(big)
    r = _cli(store, "send", "T", "--body-file", str(tmp_path / "body.bin"))
    assert r.returncode == 0 and "offset=0" in r.stdout, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "rocketspark.cli", "--store", store, "send", "T"]
        + ["--body-file", "-", "--keys", "piped"],
        input=big[::-1],
        capture_output=True,
        timeout=120,
        env=dict(os.environ, ROCKETSPARK_STORE=""),
    )
    assert r.returncode == 0 and b"offset=1" in r.stdout, r.stderr
    with MessageStore.open(store) as s:
        assert [m.body for m in s.pull("T", 0, 0).messages] == [big, big[::-1]]
    for args, message in [
        (("--body-file", str(tmp_path / "absent.bin")), "absent.bin: No such file"),
        (("--body-file", str(tmp_path)), "Is a directory"),
        (("x", "--body-file", str(tmp_path / "body.bin")), "a BODY or --body-file, not both"),
        ((), "send needs a BODY, or --body-file PATH"),
    ]:
        r = _cli(store, "send", "T", *args)
        assert r.returncode == 2 and "UsageError" in r.stderr and message in r.stderr, (
            args,
            r.stderr,
        )
        assert "Traceback" not in r.stderr
    with MessageStore.open(store) as s:
        assert s.max_offset("T", 0) == 2  # nothing more was sent


def test_send_without_a_queue_starts_where_a_producer_would_not_at_queue_0(tmp_path):
    """Each send opens the store anew (a process of its own, in real use): the queue
    is chosen at random, not by a round-robin that starts at 0 every time."""
    store = str(tmp_path / "s")
    assert _run_main("--store", store, "topic", "create", "T", "--queues", "4")[0] == 0
    used = set()
    for i in range(24):
        code, text = _run_main("--store", store, "send", "T", f"m{i}")
        assert code == 0, text
        used.add(int(text.split("queue=")[1].split()[0]))
    assert len(used) > 1 and used <= {0, 1, 2, 3}
    # a sharding key still picks its queue by hash, and --queue its queue
    code, text = _run_main("--store", store, "send", "T", "k", "--sharding-key", "order-7")
    keyed = text.split("queue=")[1].split()[0]
    for _ in range(3):
        code, text = _run_main("--store", store, "send", "T", "k", "--sharding-key", "order-7")
        assert code == 0 and text.split("queue=")[1].split()[0] == keyed
    assert "queue=2 " in _run_main("--store", store, "send", "T", "q", "--queue", "2")[1]


def test_a_queue_the_topic_lacks_is_a_clear_error(tmp_path):
    store = str(tmp_path / "s")
    assert _cli(store, "topic", "create", "T", "--queues", "4").returncode == 0
    for args, message in [
        (("send", "T", "x", "--queue", "4"), "queue_id 4 is out of range for topic 'T' with 4"),
        (("tail", "T", "--queue", "9"), "queue 9 of topic 'T' does not exist"),
        (("send", "T", "x", "--queue", "-1"), "--queue: must not be negative"),
        (("tail", "T", "--queue", "-1"), "--queue: must not be negative"),
    ]:
        r = _cli(store, *args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_long_scans_show_progress_with_a_rate_only_when_asked_off_a_terminal(tmp_path):
    store = str(tmp_path / "s")
    with MessageStore.open(store) as s:
        s.create_topic("T", queues=2)
        s.put_batch([Message("T", b"x" * 100) for _ in range(10_000)])
    r = _cli(store, "--progress", "tail", "T", "--group", "g", "--max", "6000")
    assert len(r.stdout.splitlines()) == 6000
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("tail T") and "6,000/6,000 messages" in last, r.stderr
    assert "messages/s" in last and " in 0:" in last
    r = _cli(store, "--progress", "store", "check", store)
    assert r.returncode == 0 and "OK" in r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("checking CommitLog") and "MiB/s" in lines[0], r.stderr
    assert lines[1].startswith("checking ConsumeQueues") and "10,000/10,000 entries" in lines[1]
    # off a terminal and not asked: nothing on stderr
    for args in (("tail", "T", "--max", "5"), ("store", "check", store)):
        r = _cli(store, *args)
        assert r.returncode == 0 and r.stderr == "", (args, r.stderr)


def test_progress_shows_rate_and_eta_then_the_time_taken():
    now = [100.0]
    stream = io.StringIO()
    bar = Progress(1000, "tail T", unit="messages", stream=stream, force=True, clock=lambda: now[0])
    now[0] = 102.0
    assert bar.line(now[0]) == "tail T  [--------------------]   0.0%  0/1,000 messages  -/s  ETA -"
    bar.update(100)
    assert stream.getvalue() == ""  # off a terminal: a line every 5 s
    now[0] = 105.0
    bar.update(250)
    assert stream.getvalue() == (
        "tail T  [#####---------------]  25.0%  250/1,000 messages  50 messages/s  ETA 0:15\n"
    )
    now[0] = 110.0
    bar.update(1500)  # past the estimate (a tail that follows): no ETA
    assert bar.line(now[0]) == "tail T  1,500 messages  150 messages/s"
    bar.close()
    assert stream.getvalue().endswith("tail T  1,500 messages  150 messages/s  in 0:10\n")
    sizes = Progress(
        3 << 30, "checking CommitLog", unit="B", stream=stream, force=True, clock=lambda: 0.0
    )
    sizes.update(1536 << 20)
    assert sizes.line(2.0).endswith("1.5 GiB/3.0 GiB  768.0 MiB/s  ETA 0:02")
    quiet = io.StringIO()
    off = Progress(10, "x", stream=quiet)  # not a terminal, not forced
    off.update(5)
    off.close()
    assert quiet.getvalue() == ""


def test_tail_interrupted_commits_what_it_printed(tmp_path):
    store = str(tmp_path / "s")
    with MessageStore.open(store) as s:
        s.create_topic("T", queues=1)
        s.put_batch([Message("T", b"m%d" % i) for i in range(3)])
    p = subprocess.Popen(
        [sys.executable, "-m", "rocketspark.cli", "--store", store]
        + ["tail", "T", "--group", "g", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # tail --follow flushes its lines itself (PYTHONUNBUFFERED would hide that)
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
    )
    stop = threading.Timer(60, p.kill)  # a line that never comes fails, not hangs, the test
    stop.start()
    try:
        assert p.stdout is not None
        printed = [json.loads(p.stdout.readline())["offset"] for _ in range(3)]
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 130
    finally:
        stop.cancel()
        p.kill()
        p.wait()
    assert printed == [0, 1, 2] and "Traceback" not in p.stderr.read()
    with MessageStore.open(store) as s:
        assert s.committed_offset("g", "T", 0) == 3
