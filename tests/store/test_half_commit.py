"""The half → committed record byte gathering, piece by piece.

That a commit through it writes the bytes the per-record commit writes is
tested end to end in test_columnar_put.py (the fast-commit tests) and
test_golden_store.py; here its parts are tested on their own.
"""

from __future__ import annotations

import numpy as np
import pytest

from rocketspark.message.java_hash import java_string_hash, tags_code
from rocketspark.message.model import TRANSACTION_TYPE_MASK, Message, SysFlag
from rocketspark.message.record import MESSAGE_MAGIC_CODE, HostAddress, decode_properties
from rocketspark.store import MessageStore, half_commit
from rocketspark.store.consume_queue import CQ_ENTRY_DTYPE
from rocketspark.store.encoder import TopicWriteInfo
from rocketspark.store.half_commit import UNIQ_HEX_LEN, final_columns

UNIQ = b"0A0B0C0D" * 4
OTHER = b"99887766" * 4
HALF_ONLY = ("TRAN_MSG", "REAL_TOPIC", "REAL_QID")


def _entries(halves) -> np.ndarray:
    """The ConsumeQueue entries of ``halves`` (MessageExt), as the commit reads them."""
    entries = np.zeros(len(halves), dtype=CQ_ENTRY_DTYPE)
    entries["offset"] = [h.commitlog_offset for h in halves]
    entries["size"] = [h.store_size for h in halves]
    entries["tags"] = [tags_code(h.tags) for h in halves]
    return entries


def _topic_info(queues: int):
    def info(topic: str) -> TopicWriteInfo:
        field = topic.encode()
        return TopicWriteInfo(queues, bytes((len(field),)) + field, MESSAGE_MAGIC_CODE)

    return info


def _committed(store: MessageStore, halves, queues: int = 4) -> dict | None:
    """final_columns over ``halves``, read out into plain values (no views left)."""
    got = final_columns(
        _entries(halves),
        store.commit_log,
        _topic_info(queues),
        HostAddress.parse("127.0.0.1", 4321),
    )
    if got is None:
        return None
    batch, uniq_prefix, uniq_start, uniq_given, keyed, key_strings, hashes = got
    n = len(batch)
    topics = [batch.topic_of(i) for i in range(n)]
    out = {
        "topics": topics,
        "queue_ids": batch.queue_ids.tolist(),
        "bodies": batch.bodies.to_list(),
        "properties": [decode_properties(p) for p in batch.rests[2].to_list()],
        "topic_fields": batch.rests[0].to_list(),
        "sys_flags": np.broadcast_to(batch.sys_flags, n).tolist(),
        "prepared": np.broadcast_to(batch.prepared, n).tolist(),
        "tags_codes": batch.tags_codes.tolist(),
        "uniq": [uniq_given.get(i) for i in range(n)],
        "uniq_prefix": (uniq_prefix, uniq_start),
        "keyed": list(keyed),
        "key_strings": list(key_strings),
        "hashes": hashes.tolist(),
    }
    del batch, uniq_given, got  # views of the mapped segments
    return out


@pytest.mark.parametrize("how", ["columns", "messages"])
def test_final_columns_take_each_committed_record_from_its_half(tmp_path, how):
    with MessageStore.open(tmp_path / "s") as s:
        for t in ("orders", "payments"):
            s.create_topic(t, queues=4)
        topics = ["orders", "payments", "orders"] * 10
        keys = [[f"k{i}", "x"] if i % 4 == 0 else None for i in range(30)]
        bodies = [b"body-%d" % i * (i % 3 + 1) for i in range(30)]
        if how == "columns":
            s.prepare_columns(
                bodies,
                topics=topics,
                keys=keys,
                tags=["created"] * 30,
                producer_group="pg",
                extra_properties={"RS": "x"},
            )
        else:
            s.prepare_batch(
                [
                    Message(t, b, tags="created", keys=k or ())
                    for t, b, k in zip(topics, bodies, keys, strict=True)
                ],
                producer_group="pg",
                properties={"RS": "x"},
            )
        halves = s.open_transactions()
        got = _committed(s, halves)
    assert got is not None
    assert got["topics"] == topics
    assert got["topic_fields"] == [bytes((len(t),)) + t.encode() for t in topics]
    assert got["queue_ids"] == [int(h.properties["REAL_QID"]) for h in halves]
    assert got["bodies"] == bodies
    assert got["properties"] == [
        {k: v for k, v in h.properties.items() if k not in HALF_ONLY} for h in halves
    ]
    assert all(p["PGROUP"] == "pg" and p["RS"] == "x" for p in got["properties"])
    assert [f & TRANSACTION_TYPE_MASK for f in got["sys_flags"]] == [
        SysFlag.TRANSACTION_COMMIT
    ] * 30
    assert got["prepared"] == [h.commitlog_offset for h in halves]
    assert got["tags_codes"] == [tags_code("created")] * 30
    assert got["uniq"] == [h.uniq_key for h in halves]
    assert got["hashes"] == [
        java_string_hash(f"{h.properties['REAL_TOPIC']}#{h.uniq_key}") for h in halves
    ]
    assert got["keyed"] == [i for i in range(30) if keys[i]]
    assert got["key_strings"] == [f"k{i} x" for i in range(30) if keys[i]]


def test_final_columns_refuse_records_that_are_not_our_halves(tmp_path):
    with MessageStore.open(tmp_path / "s") as s:
        s.create_topic("orders", queues=4)
        s.put_batch([Message("orders", b"plain %d" % i) for i in range(5)])
        plain = s.pull("orders", 0, 0).messages + s.pull("orders", 1, 0).messages
        assert plain
        assert _committed(s, plain) is None


def test_halves_of_a_few_layouts_are_read_layout_by_layout(tmp_path, monkeypatch):
    used = []
    parse_layouts = half_commit._parse_layouts

    def spy(*args):
        got = parse_layouts(*args)
        used.append(got is not None)
        return got

    monkeypatch.setattr(half_commit, "_parse_layouts", spy)
    with MessageStore.open(tmp_path / "s") as s:
        s.create_topic("orders", queues=12)  # REAL_QID of one and two digits: two sizes
        s.prepare_columns([b"same size"] * 40, topic="orders", producer_group="pg")
        halves = s.open_transactions()
        got = _committed(s, halves, queues=12)
    assert used == [True]
    assert got is not None and got["uniq"] == [h.uniq_key for h in halves]
    assert len({h.store_size for h in halves}) == 2


# --- the byte helpers -------------------------------------------------------------------


def test_property_reads_one_encoded_property():
    """The parse a half's KEYS and UNIQ_KEY are read with (message/properties.py)."""
    p = b"KEYS\x01a b\x02XTAGS\x01no\x02TAGS\x01t\x02UNIQ_KEY\x01last"
    assert decode_properties(p).get("KEYS") == "a b"
    assert decode_properties(p).get("TAGS") == "t"  # not XTAGS' value
    assert decode_properties(p).get("UNIQ_KEY") == "last"  # the last one has no \x02
    assert decode_properties(p).get("DELAY") is None
    assert decode_properties(b"").get("KEYS") is None


def _prefix(uniq: bytes, txn: bytes, extra: bytes = b"RS\x01x\x02") -> bytes:
    """A committed prefix as the prepare paths write it (before TRAN_MSG)."""
    return (
        b"TAGS\x01t\x02UNIQ_KEY\x01"
        + uniq
        + b"\x02PGROUP\x01pg\x02__transactionId__\x01"
        + txn
        + b"\x02"
        + extra
    )


@pytest.mark.parametrize("extra", [b"", b"RS\x01x\x02", b"A\x011\x02B\x01two\x02"])
def test_learn_uniq_template_finds_both_slots(extra):
    p = _prefix(UNIQ, UNIQ, extra)
    learned = half_commit._learn_uniq_template(p)
    assert learned is not None
    template, mask, first, second = learned
    tail = p[len(p) - len(template) :]
    assert tail[first : first + UNIQ_HEX_LEN] == tail[second : second + UNIQ_HEX_LEN] == UNIQ
    fixed = np.frombuffer(template, dtype=np.uint8)[mask]
    assert bytes(fixed) == bytes(np.frombuffer(tail, dtype=np.uint8)[mask])
    assert (~mask).sum() == 2 * UNIQ_HEX_LEN
    # Another half of the same layout matches the template but in the slots.
    other = _prefix(OTHER, OTHER, extra)
    assert half_commit._learn_uniq_template(other)[0] == template


@pytest.mark.parametrize(
    "p",
    [
        _prefix(UNIQ, OTHER),  # the transaction id is not the UNIQ_KEY
        _prefix(UNIQ[:-1], UNIQ[:-1]),  # not 32 characters
        _prefix(UNIQ, UNIQ).replace(b"PGROUP", b"GROUPX"),
        b"TAGS\x01t\x02",
    ],
)
def test_learn_uniq_template_refuses_other_layouts(p):
    assert half_commit._learn_uniq_template(p) is None


def test_rows_equal_compares_each_row_in_place(monkeypatch):
    monkeypatch.setattr(half_commit, "_ROWS", 2)  # several blocks
    buf = np.frombuffer(b"abcXabcYabXZab", dtype=np.uint8)
    at = np.asarray([0, 4, 8, 12, -1, 11])
    assert half_commit._rows_equal(buf, at, b"abc").tolist() == [
        True,
        True,
        False,
        False,  # runs past the end
        False,  # before the start
        False,
    ]
    mask = np.asarray([True, True, False])
    assert half_commit._rows_equal(buf, at, b"abc", mask).tolist()[:3] == [True, True, True]
    assert not half_commit._rows_equal(buf[:2], at, b"abc").any()


def test_differs_rows_against_one_row_or_row_by_row(monkeypatch):
    monkeypatch.setattr(half_commit, "_ROWS", 3)
    rows = np.tile(np.frombuffer(b"same", dtype=np.uint8), (7, 1))
    assert not half_commit._differs_rows(rows, rows[:1])
    assert not half_commit._differs_rows(rows, rows.copy())
    changed = rows.copy()
    changed[6, 2] = 0  # in the last block
    assert half_commit._differs_rows(changed, rows[:1])
    assert half_commit._differs_rows(rows, changed)
