"""The columnar put_batch writes the same bytes as the per-record path."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

from rocketspark.message.results import PutResults
from rocketspark.store import Message, MessageStore, PutStatus, commit_log, half_commit

SMALL = dict(
    mappedFileSizeCommitLog=8192,
    mappedFileSizeConsumeQueue=20 * 32,
    maxHashSlotNum=64,
    maxIndexNum=512,
)


def _files(root: str, sub: str) -> list[bytes]:
    out = []
    base = os.path.join(root, sub)
    for dirpath, _, names in sorted(os.walk(base)):
        for name in sorted(names):
            with open(os.path.join(dirpath, name), "rb") as f:
                out.append((os.path.relpath(os.path.join(dirpath, name), base), f.read()))
    return out


def _index_bodies(root: str) -> list[bytes]:
    return [data for _, data in _files(root, "index")]


def _pinned_store(root: str, clock, topics: dict[str, int], counter: int = 0) -> MessageStore:
    """A store whose generated UNIQ_KEYs start at a fixed value (the same in both stores
    a test compares), with ``topics`` created."""
    s = MessageStore.open(root, clock=clock, **SMALL)
    s.encoder.ids._prefix = "7F000001" + "0" * 12
    s.encoder.ids._counter = counter
    for t, q in topics.items():
        s.create_topic(t, queues=q)
    return s


def _assert_same_stores(a: str, b: str) -> None:
    """Two store directories hold the same CommitLog, ConsumeQueue and index bytes."""
    assert _files(a, "commitlog") == _files(b, "commitlog")
    assert _files(a, "consumequeue") == _files(b, "consumequeue")
    assert _index_bodies(a) == _index_bodies(b)


THREE_TOPICS = {"orders": 3, "payments": 3, "t" * 127: 3}


def _messages(rng: random.Random, n: int) -> list[Message]:
    out = []
    for i in range(n):
        topic = rng.choice(["orders", "payments", "t" * 127])
        kind = rng.randrange(6)
        out.append(
            Message(
                topic,
                bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))),
                tags=rng.choice([None, "created", "paid", "ünïcode"]),
                keys=rng.choice([(), (f"k-{i}",), (f"a{i}", f"b{i}")]),
                properties=rng.choice([{}, {"p": "v"}, {"UNIQ_KEY": f"MY-ID-{i}", "x": "é"}]),
                queue_id=rng.randrange(3) if kind == 0 else None,
                sharding_key=(f"cust-{rng.randrange(5)}") if kind == 1 else None,
                flag=rng.randrange(3) if kind == 2 else 0,
                reconsume_times=rng.randrange(3) if kind == 3 else 0,
                born_timestamp=1_600_000_000_000 + i if kind == 4 else None,
            )
        )
    return out


@pytest.fixture(params=["join", "gather", "gather-regions"])
def copy_path(request, monkeypatch):
    """Both ways append_columns copies bytes: joined objects, and the segmented gather
    (with a commit's halves copied out as one region, or each as its own)."""
    if request.param.startswith("gather"):
        monkeypatch.setattr(commit_log, "GATHER_MIN", commit_log.SMALL_BATCH + 1)
    if request.param == "gather-regions":
        monkeypatch.setattr(half_commit, "_REGION_GAP", -1)
    return request.param


def test_columnar_and_per_record_paths_write_identical_stores(tmp_path, clock, copy_path):
    rng = random.Random(7)
    batches = [_messages(rng, rng.randrange(1, 60)) for _ in range(12)]
    roots = []
    for columnar in (True, False):
        root = str(tmp_path / ("col" if columnar else "rec"))
        with _pinned_store(root, clock, THREE_TOPICS) as s:
            s.encoder.columnar = columnar
            for b in batches:
                rs = s.put_batch(b)
                assert isinstance(rs, PutResults) == columnar
                assert len(rs) == len(b)
                clock.advance(3)
        clock.now -= 3 * len(batches)
        roots.append(root)
    col, rec = roots
    _assert_same_stores(col, rec)
    keyed = [(m.topic, k) for b in batches for m in b for k in m.keys]
    assert len(keyed) > 50
    with MessageStore.open(col, **SMALL) as s:  # and the store finds what it indexed
        for topic, key in keyed[::7]:
            hits = s.query_by_key(topic, key)
            assert len(hits) == keyed.count((topic, key))
            assert all(key in m.keys and m.topic == topic for m in hits)


def test_put_results_are_lazy_but_complete(tmp_path):
    with MessageStore.open(tmp_path / "s", **SMALL) as s:
        s.create_topic("orders", queues=2)
        rs = s.put_batch([Message("orders", b"m%d" % i, keys=[f"k{i}"]) for i in range(50)])
        assert rs.status is PutStatus.PUT_OK
        assert [r.queue_id for r in rs[:4]] == [0, 1, 0, 1]
        last = rs[-1]
        assert (last.queue_id, last.queue_offset) == (1, 24)
        got = s.get_message(last.commitlog_offset)
        assert got.msg_id == last.msg_id and got.uniq_key == last.uniq_key
        assert got.body == b"m49"
        assert [m.body for m in s.query_by_key("orders", "k7")] == [b"m7"]
        uniq = rs[3].uniq_key
        assert [m.body for m in s.query_by_key("orders", uniq)] == [b"m3"]
        with pytest.raises(IndexError):
            rs[50]


def test_columnar_put_checks_every_size_before_writing(tmp_path):
    from rocketspark.errors import MessageTooLargeError

    with MessageStore.open(tmp_path / "s", maxMessageSize=100, **SMALL) as s:
        s.create_topic("orders", queues=1)
        with pytest.raises(MessageTooLargeError, match="maxMessageSize 100"):
            s.put_batch([Message("orders", b"ok"), Message("orders", b"x" * 101)])
        assert s.max_offset("orders", 0) == 0
        assert s.put(Message("orders", b"ok")).queue_offset == 0


@pytest.mark.parametrize("mixed", [False, True])
def test_single_puts_write_the_same_bytes_as_one_batch(tmp_path, clock, mixed):
    """put() (its own lean path) against the per-record put_batch, segment rolls included."""
    if mixed:
        msgs = _messages(random.Random(11), 120)
    else:
        msgs = [
            Message("orders", b"m%d" % i, tags=f"t{i % 3}", keys=[f"k{i}"] if i % 2 else ())
            for i in range(40)
        ]
    roots = []
    for single in (True, False):
        root = str(tmp_path / ("one" if single else "batch"))
        with _pinned_store(root, clock, THREE_TOPICS) as s:
            if single:
                results = [s.put(m) for m in msgs]
            else:
                s.encoder.columnar = False
                results = s.put_batch(msgs)
        roots.append(root)
        if single:
            singles = results
    assert [
        (
            r.topic,
            r.queue_id,
            r.queue_offset,
            r.commitlog_offset,
            r.msg_id,
            r.uniq_key,
            r.store_size,
        )
        for r in singles
    ] == [
        (
            r.topic,
            r.queue_id,
            r.queue_offset,
            r.commitlog_offset,
            r.msg_id,
            r.uniq_key,
            r.store_size,
        )
        for r in results
    ]
    _assert_same_stores(*roots)


def test_put_columns_and_prepare_columns_write_what_the_message_paths_write(
    tmp_path, clock, copy_path
):
    rng = random.Random(3)
    msgs = _messages(rng, 40)
    msgs = [
        Message(
            m.topic,
            m.body,
            tags=m.tags,
            keys=m.keys,
            properties=m.properties,
            queue_id=m.queue_id,
            sharding_key=m.sharding_key,
        )
        for m in msgs
    ]
    cols = dict(
        topics=[m.topic for m in msgs],
        tags=[m.tags for m in msgs],
        keys=[list(m.keys) or None for m in msgs],
        properties=[list(m.properties.items()) or None for m in msgs],
        queue_ids=[m.queue_id for m in msgs],
        sharding_keys=[m.sharding_key for m in msgs],
    )
    roots = []
    for columnar in (True, False):
        root = str(tmp_path / ("col" if columnar else "msg"))
        with _pinned_store(root, clock, THREE_TOPICS) as s:
            if columnar:
                s.put_columns([m.body for m in msgs], **cols)
                hs = s.prepare_columns(
                    [m.body for m in msgs],
                    producer_group="pg",
                    extra_properties={"RS_SINK": "x"},
                    **cols,
                )
            else:  # the per-record paths all the way, commit included
                s.encoder.columnar = False
                s.put_batch(msgs)
                hs = s.prepare_batch(msgs, producer_group="pg", properties={"RS_SINK": "x"})
            assert [h.queue_offset for h in hs] == list(range(40))
            s.commit_transaction(hs[:3])  # a few: the small append path
            s.commit_transaction(hs[3:25])
            s.rollback_transaction(hs[25:])
        roots.append(root)
    _assert_same_stores(*roots)


def test_put_columns_rejects_bad_rows_before_writing(tmp_path):
    from rocketspark.errors import ConfigError

    with MessageStore.open(tmp_path / "s", **SMALL) as s:
        s.create_topic("orders", queues=1)
        with pytest.raises(ConfigError, match="row 1 of topic 'orders'.*separator"):
            s.put_columns([b"a", b"b"], topic="orders", tags=["ok", "bad\x01tag"])
        with pytest.raises(ConfigError, match="row 0 of topic 'orders': the message body is null"):
            s.put_columns([None], topic="orders")
        with pytest.raises(ConfigError, match="column tags has 1 entries, bodies has 2"):
            s.put_columns([b"a", b"b"], topic="orders", tags=["x"])
        assert s.max_offset("orders", 0) == 0
        rs = s.put_columns(["text body", b"raw"], topic="orders", keys=["a b", ["c", "d"]])
        assert [m.body for m in s.pull("orders", 0, 0).messages] == [b"text body", b"raw"]
        assert [m.keys for m in s.pull("orders", 0, 0).messages] == [["a", "b"], ["c", "d"]]
        assert len(rs) == 2


@pytest.mark.parametrize("queues", [4, 12])
def test_uniform_batches_write_what_the_message_paths_write(tmp_path, clock, copy_path, queues):
    """Rows that differ only in body take the template path: same bytes as per record."""
    roots = []
    for columnar in (True, False):
        root = str(tmp_path / ("col" if columnar else "msg"))
        # (the UNIQ_KEY counter wraps inside a batch)
        with _pinned_store(root, clock, {"uniform": queues, "t" * 127: 2}, 65500) as s:
            if not columnar:
                s.encoder.columnar = False
            varied = [None, "a", "bb", "é", "created"]
            for tag, topic, keyed in (
                (None, "uniform", False),
                ("created", "uniform", False),
                ("é", "t" * 127, False),
                (None, "uniform", True),
                ("paid", "t" * 127, True),
                (varied, "uniform", False),
                (varied, "t" * 127, True),
            ):
                tags = [tag[i % 5] if isinstance(tag, list) else tag for i in range(150)]
                msgs = [
                    Message(
                        topic,
                        b"body-%d" % i * (i % 7 + 1),
                        tags=tags[i],
                        keys=([f"k{i}", f"ü{i % 5}"] if i % 3 else f"one-{i}" if i % 2 else ())
                        if keyed
                        else (),
                    )
                    for i in range(150)
                ]
                rs = s.put_batch(msgs)
                n_q = s.topic(topic).write_queue_nums
                assert [r.queue_id for r in rs] == [
                    (rs[0].queue_id + k) % n_q for k in range(150)
                ]  # round robin
                if columnar:
                    hs = s.prepare_columns(
                        [m.body for m in msgs],
                        topic=topic,
                        tags=tags,
                        keys=[list(m.keys) for m in msgs],
                        producer_group="pg",
                        extra_properties={"RS": "x"},
                    )
                else:
                    hs = s.prepare_batch(msgs, producer_group="pg", properties={"RS": "x"})
                s.commit_transaction(hs[:100])
                s.rollback_transaction(hs[100:])
                clock.advance(1)
        clock.now -= 7
        roots.append(root)
    _assert_same_stores(*roots)


_TRICKY = [
    b"",
    b"TRAN_MSG\x01true\x02REAL_TOPIC\x01x\x02REAL_QID\x011\x02",
    b"\x02" * 40,
    b"UNIQ_KEY\x01" + b"A" * 32,
    b"KEYS\x01k",
]


@pytest.mark.parametrize("seed", range(6))
def test_fast_commit_writes_what_the_record_commit_writes(tmp_path, clock, seed):
    """Random halves (many queues, tricky bodies, extra properties, own UNIQ_KEYs,
    keys, tags) committed in random groups: the sliced commit and the per-record
    commit leave byte-identical stores."""
    rng = random.Random(seed)
    topics = {"orders": rng.choice([1, 3, 12]), "t" * 127: 2, "big": rng.choice([150, 1024])}
    msgs = []
    for i in range(rng.randrange(60, 160)):
        topic = rng.choice(list(topics))
        props = rng.choice(
            [
                {},
                {"p": "v" * rng.randrange(0, 5)},
                {"UNIQ_KEY": f"OWN-{i}"},
                {"UNIQ_KEY": "B" * 32 + str(i % 2)},
                {"x": "é", "y": "REAL_QID"},
            ]
        )
        msgs.append(
            Message(
                topic,
                rng.choice(_TRICKY)
                + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 50))),
                tags=rng.choice([None, f"t{rng.randrange(3)}", "ünï"]),
                keys=rng.choice([(), (f"k-{i}",), (f"a{i}", "b")]),
                properties=props,
                queue_id=rng.randrange(topics[topic]) if rng.random() < 0.3 else None,
            )
        )
    extra = rng.choice([{}, {"RS_SINK": "s-1"}, {"A": "1", "B": "two"}])
    groups = []
    order = list(range(len(msgs)))
    rng.shuffle(order)
    while order:
        k = rng.randrange(1, 40)
        groups.append(sorted(order[:k]))
        order = order[k:]
    commit = [rng.random() < 0.8 for _ in groups]
    roots = []
    for columnar in (True, False):
        root = str(tmp_path / ("fast" if columnar else "record"))
        with _pinned_store(root, clock, topics) as s:
            if columnar:  # the columnar prepare, and the sliced commit
                hs = s.prepare_columns(
                    [m.body for m in msgs],
                    topics=[m.topic for m in msgs],
                    tags=[m.tags for m in msgs],
                    keys=[list(m.keys) or None for m in msgs],
                    properties=[dict(m.properties) or None for m in msgs],
                    queue_ids=[m.queue_id for m in msgs],
                    producer_group="pg",
                    extra_properties=extra,
                )
            else:  # the per-record prepare, and the per-record commit
                s.encoder.columnar = False
                hs = s.prepare_batch(msgs, producer_group="pg", properties=extra)
            for g, c in zip(groups, commit, strict=True):
                if c:
                    s.commit_transaction([hs[i] for i in g])
                else:
                    s.rollback_transaction([hs[i] for i in g])
        roots.append(root)
    _assert_same_stores(*roots)


@pytest.mark.parametrize(
    "layout",
    ["plain", "tagged", "same-keys", "keys-per-row", "12-queues", "long-topic", "big-queue-ids"],
)
def test_commits_of_halves_of_a_few_layouts_write_what_the_record_commit_writes(
    tmp_path, clock, monkeypatch, layout
):
    """A sink's halves: records of a few layouts, one per size (REAL_QID digits), which
    the commit checks and reads layout by layout (half_commit._parse_layouts). Same
    bytes as the per-record commit, and that parser is used exactly when every half
    of a size has one layout (not when each row has its own keys)."""
    used = []
    parse_layouts = half_commit._parse_layouts

    def spy(*args):
        got = parse_layouts(*args)
        used.append(got is not None)
        return got

    monkeypatch.setattr(half_commit, "_parse_layouts", spy)
    monkeypatch.setattr(half_commit, "_ROWS", 64)  # halves checked in several blocks
    n = 300
    topic = "t" * 127 if layout == "long-topic" else "orders"
    queues = {"12-queues": 12, "big-queue-ids": 1024}.get(layout, 4)
    tags = "created" if layout == "tagged" else None
    keys = {"same-keys": ["k1", "k2"], "keys-per-row": None}.get(layout, [])
    roots = []
    for columnar in (True, False):
        root = str(tmp_path / ("fast" if columnar else "record"))
        with MessageStore.open(root, clock=clock, mappedFileSizeCommitLog=1 << 20) as s:
            s.encoder.ids._prefix = "7F000001" + "0" * 12
            s.encoder.ids._counter = 65400  # the UNIQ_KEY counter wraps inside the batch
            s.create_topic(topic, queues=queues)
            msgs = [
                Message(
                    topic,
                    b"body-%03d" % i,
                    tags=tags,
                    keys=keys if keys is not None else [f"row-{i}"] * (i % 2 + 1),
                )
                for i in range(n)
            ]
            if columnar:
                hs = s.prepare_columns(
                    [m.body for m in msgs],
                    topic=topic,
                    tags=[tags] * n,
                    keys=[list(m.keys) for m in msgs],
                    producer_group="pg",
                    extra_properties={"rocketsparkSinkId": "s-1"},
                )
                hs2 = s.prepare_columns(
                    [m.body for m in msgs],
                    topic=topic,
                    producer_group="pg",
                    extra_properties={"rocketsparkSinkId": "s-1"},
                )
            else:
                s.encoder.columnar = False
                hs = s.prepare_batch(
                    msgs, producer_group="pg", properties={"rocketsparkSinkId": "s-1"}
                )
                hs2 = s.prepare_batch(
                    [Message(topic, m.body) for m in msgs],
                    producer_group="pg",
                    properties={"rocketsparkSinkId": "s-1"},
                )
            s.commit_transaction([*hs[:250], *hs2[:200]])
            s.rollback_transaction([*hs[250:], *hs2[200:]])
        roots.append(root)
    _assert_same_stores(*roots)
    assert used and all(used) == (layout != "keys-per-row")
    with MessageStore.open(roots[0]) as s:  # and the committed records read back
        got = [m for q in range(queues) for m in s.pull(topic, q, 0, max_msgs=1000).messages]
        assert sorted(m.body for m in got) == sorted(
            [b"body-%03d" % i for i in range(250)] + [b"body-%03d" % i for i in range(200)]
        )
        if layout == "same-keys":
            assert len(s.query_by_key(topic, "k2", max_num=1000)) == 250


def test_keys_with_empty_pieces_and_repeated_names_read_back_as_pull_reads_them(tmp_path):
    """KEYS "a  b" (as a producer may write them) hold no empty key, and (name, value)
    pairs naming a property twice keep the last value, in Arrow rows as in pull()."""
    with MessageStore.open(str(tmp_path / "s")) as s:
        s.create_topic("t", queues=1)
        s.put_columns(
            [b"0", b"1", b"2", b"3"],
            topic="t",
            keys=["a  b", " c", None, "d "],
            properties=[[("color", "red"), ("color", "blue")], None, None, None],
        )
        pulled = s.pull("t", 0, 0).messages
        batches, _ = s.read_batches("t", 0, 0, None)
        rows = pa.Table.from_batches(batches).to_pylist()
    assert [m.keys for m in pulled] == [["a", "b"], ["c"], [], ["d"]]
    assert [r["keys"] for r in rows] == [["a", "b"], ["c"], None, ["d"]]
    assert pulled[0].properties["color"] == "blue"
    assert [(k, v) for k, v in rows[0]["properties"] if k == "color"] == [("color", "blue")]
