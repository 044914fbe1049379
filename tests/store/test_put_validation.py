"""Every put path refuses the same messages, before a queue offset is taken.

put, put_batch (up to 8 messages: the struct path; more: the numpy path),
put_columns (the row loop, and the uniform path from 64 rows) and the
transactional prepares check one set of field rules; a refusal leaves no
ConsumeQueue hole, so the next acknowledged message is where a reader,
another process and a reopened store look for it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketspark.errors import (
    ConfigError,
    InvalidMessageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RocketSparkError,
)
from rocketspark.message.model import SCHEDULE_TOPIC, dlq_topic, retry_topic
from rocketspark.store import Message, MessageStore

MAX_BODY = 2048
OPTIONS = {"maxMessageSize": MAX_BODY, "mappedFileSizeCommitLog": 1 << 16}

# One fault at a time: (field, bad value) and whether put_columns has that field.
FAULTS = [
    ("flag", 1 << 31),
    ("flag", -(1 << 31) - 1),
    ("flag", 2**40 + 5),
    ("flag", "1"),
    ("born_timestamp", 2**70),
    ("born_timestamp", 2**63),
    ("born_timestamp", -1),
    ("reconsume_times", 1 << 31),
    ("reconsume_times", -1),
    ("reconsume_times", 1.0),
    ("delay_level", 99),
    ("delay_level", 19),
    ("delay_level", -1),
    ("delay_level", True),
    ("queue_id", 1),
    ("queue_id", -1),
    ("queue_id", "0"),
    ("queue_id", 0.0),
    ("queue_id", True),
    ("tags", "t\ud800"),
    ("tags", "a\x01b"),
    ("tags", 5),
    ("keys", ["k\udfff"]),
    ("keys", ["a b"]),
    ("keys", ["", "k"]),
    ("keys", "a\x02"),
    ("keys", 5),
    ("keys", [5]),
    ("properties", {"p\ud800": "v"}),
    ("properties", {"p": "v\ud800"}),
    ("properties", {"TAGS": "x"}),
    ("properties", {"KEYS": "x"}),
    ("properties", {"": "v"}),
    ("properties", {"p": 5}),
    ("properties", {"p": "a\x01"}),
    ("properties", {"p": "v" * 40_000}),
    ("body", b""),
    ("body", ""),
    ("body", "x\ud800"),
    ("body", None),
    ("body", 5),
    ("body", b"x" * (MAX_BODY + 1)),
    ("sharding_key", 5),
    ("topic", 5),
]
COLUMN_OF = {
    "tags": "tags",
    "keys": "keys",
    "properties": "properties",
    "queue_id": "queue_ids",
    "sharding_key": "sharding_keys",
    "topic": "topics",
}

valid_text = st.text(
    st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=6,
)
valid_message = st.fixed_dictionaries(
    {
        "body": st.binary(min_size=1, max_size=40) | valid_text,
        "tags": st.none() | valid_text,
        "keys": st.lists(valid_text, max_size=2),
        "properties": st.dictionaries(
            valid_text.filter(lambda t: t not in ("TAGS", "KEYS", "DELAY", "UNIQ_KEY")),
            valid_text,
            max_size=2,
        ),
    }
)
# Fields put_columns does not take: set in some examples only (the others also run it).
extra_fields = st.just({}) | st.fixed_dictionaries(
    {
        "flag": st.integers(-(1 << 31), (1 << 31) - 1),
        "reconsume_times": st.integers(0, (1 << 31) - 1),
        "born_timestamp": st.none() | st.integers(1, (1 << 63) - 1),
    }
)


def _fields(spec: dict, fault: tuple[str, object] | None) -> dict:
    fields = {"topic": "t", **spec}
    if fault is not None:
        fields[fault[0]] = fault[1]
    return fields


def _outcome(call) -> type | None:
    try:
        call()
    except RocketSparkError as e:
        return type(e)
    return None


def _columns(rows: list[dict]) -> dict | None:
    """put_columns arguments for ``rows``, None when a row uses a field it lacks."""
    for r in rows:
        if (
            r.get("flag", 0),
            r.get("reconsume_times", 0),
            r.get("born_timestamp"),
            r.get("delay_level", 0),
        ) != (0, 0, None, 0):
            return None
    out = {"bodies": [r["body"] for r in rows], "topics": [r["topic"] for r in rows]}
    for field, column in COLUMN_OF.items():
        if column != "topics" and any(field in r for r in rows):
            out[column] = [r.get(field) for r in rows]
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=valid_message,
    extra=extra_fields,
    fault=st.none() | st.sampled_from(FAULTS),
    where=st.integers(0, 79),
)
def test_every_put_path_refuses_the_same_messages_and_leaves_no_hole(
    tmp_path_factory, spec, extra, fault, where
):
    """For any message (valid, or with one bad field) every path accepts it or every
    path raises the same error; either way the next put gets the next queue offset."""
    root = tmp_path_factory.mktemp("paths")
    bad = _fields({**spec, **extra}, fault)
    plain = {"topic": "t", "body": b"ok"}
    with MessageStore.open(root, **OPTIONS) as store:
        store.create_topic("t", queues=1)
        expected = 0  # the queue offset the next good put must get
        outcomes = {}

        def run(name, n_rows, call):
            nonlocal expected
            got = _outcome(call)
            outcomes[name] = got
            if got is None:
                expected += n_rows
            r = store.put(Message("t", b"after-" + name.encode()))
            assert r.queue_offset == expected, (name, got)
            expected += 1

        run("put", 1, lambda: store.put(Message(**bad)))
        for n in (5, 20):  # the struct path (<= 8 records) and the numpy path
            at = where % n
            run(
                f"put_batch{n}",
                n,
                lambda n=n, at=at: store.put_batch(
                    [Message(**(bad if i == at else plain)) for i in range(n)]
                ),
            )
        for n in (5, 80):  # the row loop, and (80 rows) the uniform path when it applies
            at = where % n
            cols = _columns([bad if i == at else plain for i in range(n)])
            if cols is not None:
                run(
                    f"put_columns{n}",
                    n,
                    lambda cols=cols: store.put_columns(cols.pop("bodies"), **cols),
                )
        assert len(set(outcomes.values())) == 1, (fault, outcomes)
        assert (outcomes["put"] is None) == (fault is None), fault
        body = store.pull("t", 0, 0, max_msgs=10_000).messages
        assert [m.queue_offset for m in body] == list(range(expected))
    with MessageStore.open(root, **OPTIONS) as again:
        assert again.max_offset("t", 0) == expected
        assert len(again.pull("t", 0, 0, max_msgs=10_000).messages) == expected


@pytest.mark.parametrize(
    "field, value",
    [
        ("flag", 1 << 31),
        ("flag", 2**40 + 5),
        ("born_timestamp", 2**70),
        ("reconsume_times", 1 << 31),
        ("delay_level", 99),
    ],
)
@pytest.mark.parametrize("how", ["put", "put_batch3", "put_batch20"])
def test_an_out_of_range_field_is_refused_and_the_next_put_is_seen_everywhere(
    tmp_path, field, value, how
):
    """The issue's case: the refused put took queue offset 0, the next got 1 and
    no reader (pull, another process, a reopened store) ever saw it."""
    root = str(tmp_path / "s")
    with MessageStore.open(root) as store:
        store.create_topic("t", queues=1)
        with pytest.raises(InvalidMessageError, match=field):
            if how == "put":
                store.put(Message("t", b"bad", **{field: value}))
            else:
                n = int(how[len("put_batch") :])
                store.put_batch(
                    [Message("t", b"x")] * (n - 1) + [Message("t", b"bad", **{field: value})]
                )
        assert store.put(Message("t", b"good")).queue_offset == 0
        assert [m.body for m in store.pull("t", 0, 0).messages] == [b"good"]
        assert not store.has_topic(SCHEDULE_TOPIC) or all(
            store.max_offset(SCHEDULE_TOPIC, q) == 0 for q in range(18)
        )
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys\nfrom rocketspark.store import MessageStore\n"
                "with MessageStore.open(sys.argv[1]) as s:\n"
                "    print(s.max_offset('t', 0), [m.body for m in s.pull('t', 0, 0).messages])",
                root,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert other.stdout.split(None, 1) == ["1", "[b'good']\n"], other.stderr
    with MessageStore.open(root) as again:
        assert [m.body for m in again.pull("t", 0, 0).messages] == [b"good"]


def _fail_after_reserving(store, monkeypatch):
    """Make the next append fail right after it reserved its queue offsets."""
    reserve = store.appender.reserve_queue_offsets
    calls = []

    def reserve_then_fail(topic, queue_id, count):
        first = reserve(topic, queue_id, count)
        if not calls:
            calls.append(topic)
            raise RuntimeError("injected failure after the reservation")
        return first

    monkeypatch.setattr(store.appender, "reserve_queue_offsets", reserve_then_fail)
    return calls


@pytest.mark.parametrize(
    "how",
    [
        "put",
        "put_batch3",
        "put_batch20",
        "put_columns100",
        "put_batch_delayed",
        "prepare",
        "prepare_columns100",
    ],
)
def test_an_append_failing_after_its_reservation_gives_the_offsets_back(tmp_path, monkeypatch, how):
    root = str(tmp_path / "s")
    with MessageStore.open(root) as store:
        store.create_topic("t", queues=1)
        store.put(Message("t", b"first"))
        calls = _fail_after_reserving(store, monkeypatch)
        with pytest.raises(RuntimeError, match="injected"):
            if how == "put":
                store.put(Message("t", b"lost"))
            elif how.startswith("put_batch") and how[-1].isdigit():
                store.put_batch([Message("t", b"lost")] * int(how[len("put_batch") :]))
            elif how == "put_columns100":
                store.put_columns([b"lost"] * 100, topic="t")
            elif how == "put_batch_delayed":
                store.put_batch([Message("t", b"lost", delay_level=2), Message("t", b"lost")])
            elif how == "prepare":
                store.prepare(Message("t", b"lost"))
            else:
                store.prepare_columns([b"lost"] * 100, topic="t", producer_group="pg")
        assert calls
        half = how.startswith("prepare")
        if half:  # the half queue lost its offset too; the next half takes it
            h = store.prepare(Message("t", b"half"))
            assert h.queue_offset == 0
            store.commit_transaction(h)
        r = store.put(Message("t", b"second"))
        assert r.queue_offset == (2 if half else 1)
        want = [b"first", b"half", b"second"] if half else [b"first", b"second"]
        assert [m.body for m in store.pull("t", 0, 0).messages] == want
        if how == "put_batch_delayed":
            assert store.max_offset(SCHEDULE_TOPIC, 1) == 0
            store.put(Message("t", b"later", delay_level=2))
            assert store.max_offset(SCHEDULE_TOPIC, 1) == 1
    with MessageStore.open(root) as again:
        assert [m.body for m in again.pull("t", 0, 0).messages] == want


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("keys", ["k\ud800"], "message property key"),
        ("tags", "t\udc80", "message property tags"),
        ("properties", {"p\ud800": "v"}, "message property name"),
        ("properties", {"p": "v\ud800"}, "message property value"),
        ("body", "b\ud800", "str body"),
        ("flag", 1 << 31, "flag"),
        ("reconsume_times", 1 << 31, "reconsume_times"),
        ("born_timestamp", 2**70, "born_timestamp"),
    ],
)
def test_errors_from_outside_the_hierarchy_are_rocketspark_errors_naming_the_field(
    tmp_path, field, value, named
):
    with MessageStore.open(tmp_path / "s") as store:
        store.create_topic("t", queues=1)
        with pytest.raises(InvalidMessageError, match=named):
            store.put(Message(**{"topic": "t", "body": b"x", field: value}))
        column = {"keys": "keys", "tags": "tags", "properties": "properties"}.get(field)
        if column is not None or field == "body":
            for n in (3, 70):
                bodies = [b"x"] * n
                kw = {}
                if field == "body":
                    bodies[n - 1] = value
                else:
                    kw[column] = [None] * (n - 1) + [value]
                with pytest.raises(
                    InvalidMessageError, match=rf"row {n - 1} of topic 't': .*{named}"
                ):
                    store.put_columns(bodies, topic="t", **kw)
        assert store.max_offset("t", 0) == 0


def test_a_null_topic_without_a_default_is_a_config_error_in_any_row(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        store.create_topic("t", queues=1)
        for topics, row in (([None, "t"], 0), (["t", None], 1), ([None] * 70, 0)):
            with pytest.raises(ConfigError, match=f"row {row}: no topic"):
                store.put_columns([b"x"] * len(topics), topics=topics)
        assert store.max_offset("t", 0) == 0


def test_empty_bodies_are_refused_as_rocketmqs_producer_refuses_them(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        store.create_topic("t", queues=1)
        for call in (
            lambda: store.put(Message("t", b"")),
            lambda: store.put_batch([Message("t", b"x"), Message("t", "")]),
            lambda: store.put_columns([b"x", b""], topic="t"),
            lambda: store.put_columns([b"x"] * 99 + [b""], topic="t"),
            lambda: store.put_columns([b"x"] * 99 + [""], topic="t", keys=[["k"]] * 100),
            lambda: store.prepare(Message("t", bytearray())),
            lambda: store.prepare_columns([b"x"] * 70 + [b""], topic="t", producer_group="pg"),
        ):
            with pytest.raises(InvalidMessageError, match="body length is zero"):
                call()
        with pytest.raises(InvalidMessageError, match="body is null"):
            store.put_columns([None], topic="t")
        with pytest.raises(InvalidMessageError, match="got int"):  # not bytes(5): 5 zeros
            Message("t", 5)  # type: ignore[arg-type]
        assert store.max_offset("t", 0) == 0
        assert store.open_transactions() == []


def test_delay_levels_outside_the_configured_ones_are_refused(tmp_path, clock):
    with MessageStore.open(tmp_path / "s", clock=clock, messageDelayLevel="1s 5s 10s") as store:
        store.create_topic("t", queues=1)
        for level in (4, 99):
            with pytest.raises(InvalidMessageError, match=rf"delay_level {level} .* 1\.\.3"):
                store.put(Message("t", b"x", delay_level=level))
            with pytest.raises(InvalidMessageError, match="message 1 "):
                store.put_batch(
                    [Message("t", b"x", delay_level=1), Message("t", b"x", delay_level=level)]
                )
        assert not store.has_topic(SCHEDULE_TOPIC) or all(
            store.max_offset(SCHEDULE_TOPIC, q) == 0 for q in range(3)
        )
        r = store.put(Message("t", b"late", delay_level=3))
        assert (r.topic, r.queue_id) == (SCHEDULE_TOPIC, 2)
        store.put(Message("t", b"m"))
        m = store.pull("t", 0, 0).messages[0]
        with pytest.raises(InvalidMessageError, match="delay_level 4"):
            store.send_back("g", m, delay_level=4)
        assert not store.has_topic(retry_topic("g")) or store.max_offset(retry_topic("g"), 0) == 0
        # negative: the dead-letter topic; 0 with many reconsumes: capped at the last level
        assert store.send_back("g", m, delay_level=-1).topic == dlq_topic("g")
        many = store.pull("t", 0, 0).messages[0]
        object.__setattr__(many, "reconsume_times", 2)
        r = store.send_back("g", many, max_reconsume_times=16)
        assert (r.topic, r.queue_id) == (SCHEDULE_TOPIC, 2)


def test_cli_send_refuses_an_unconfigured_delay_level_and_an_empty_body(tmp_path):
    store = str(tmp_path / "s")
    with MessageStore.open(store) as s:
        s.create_topic("orders", queues=1)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "rocketspark.cli", "--store", store, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = cli("send", "orders", "b", "--delay-level", "99")
    assert r.returncode != 0 and "delay_level 99" in r.stderr, (r.stdout, r.stderr)
    r = cli("send", "orders", "")
    assert r.returncode != 0 and "body length is zero" in r.stderr, (r.stdout, r.stderr)
    with MessageStore.open(store) as s:
        assert s.max_offset("orders", 0) == 0
        assert not s.has_topic(SCHEDULE_TOPIC) or s.max_offset(SCHEDULE_TOPIC, 17) == 0


def test_store_limits_keep_their_classes_on_every_path(tmp_path):
    with MessageStore.open(tmp_path / "s", maxMessageSize=100) as store:
        store.create_topic("t", queues=1)
        for call in (
            lambda: store.put(Message("t", b"x" * 101)),
            lambda: store.put_batch([Message("t", b"x" * 101)] * 20),
            lambda: store.put_columns([b"x" * 101] * 70, topic="t"),
        ):
            with pytest.raises(MessageTooLargeError):
                call()
        for call in (
            lambda: store.put(Message("t", b"x", queue_id=1)),
            lambda: store.put_columns([b"x"] * 3, topic="t", queue_ids=[0, 0, 1]),
        ):
            with pytest.raises(OffsetOutOfRangeError):
                call()
        assert store.max_offset("t", 0) == 0
