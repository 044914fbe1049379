"""MappedFile: segments, their reservation and what readers may read of them."""

from __future__ import annotations

import os

import pytest

from rocketspark.store import Message, MessageStore
from rocketspark.store.consume_queue import CQ_STORE_UNIT_SIZE
from rocketspark.store.mapped_file import MappedFile
from tests.store.helpers.stores import SMALL

CHUNK = 1 << 16


def _segment(tmp_path) -> MappedFile:
    return MappedFile(
        str(tmp_path / "00000000000000000000"),
        0,
        4 * CHUNK,
        create=True,
        writable=True,
        chunk=CHUNK,
    )


def test_data_limit_asks_again_when_a_seen_range_ends_inside_what_a_reader_needs(tmp_path):
    f = _segment(tmp_path)
    try:
        pos = CHUNK - CQ_STORE_UNIT_SIZE // 2  # an entry that straddles the first chunk's end
        f.mm[:CHUNK] = b"\x01" * CHUNK
        assert f.data_limit(0) == CHUNK  # seen: [0, CHUNK)
        f.mm[CHUNK : 2 * CHUNK] = b"\x01" * CHUNK  # a writer goes on
        assert f.data_limit(pos) == CHUNK  # one byte is there: the seen range still answers
        assert f.data_limit(pos, CQ_STORE_UNIT_SIZE) == 2 * CHUNK
    finally:
        f.close()


def test_a_queue_read_past_a_range_seen_earlier_finds_every_entry(tmp_path):
    # The half queue's ConsumeQueue grows by reserved chunks while its readers keep
    # the data range they saw; a range ending inside an entry once stopped the
    # commit's read of the halves there (OffsetOutOfRangeError on the third batch).
    n = 100_000
    with MessageStore.open(str(tmp_path)) as store:
        store.create_topic("t", queues=4)
        for _ in range(3):
            halves = store.prepare_columns([b"x" * 100] * n, topic="t", producer_group="pg")
            store.commit_transaction(halves)
        assert sum(store.max_offset("t", q) for q in range(4)) == 3 * n


def test_segments_appear_whole_or_not_at_all(tmp_path, monkeypatch):
    """A process killed while making a segment leaves no short file under a segment
    name (a short one is damage); its hidden leftover is ignored, then removed by the
    next process that opens the store first."""
    from rocketspark.store import mapped_file

    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("orders", queues=1)
        s.put(Message("orders", b"first"))

        def killed(fd, size):
            raise OSError(28, "killed here")

        monkeypatch.setattr(mapped_file.os, "ftruncate", killed)
        with pytest.raises(OSError, match="killed here"):
            s.put_batch([Message("orders", bytes(3000)) for _ in range(3)])
        monkeypatch.undo()
    assert os.listdir(os.path.join(root, "commitlog")) == ["0" * 20]
    leftover = os.path.join(root, "commitlog", f".{4096:020d}.99999.1.tmp")
    with open(leftover, "wb") as f:
        f.write(b"x" * 10)
    with MessageStore.open(root) as s:
        assert not os.path.exists(leftover)
        s.put_batch([Message("orders", bytes(3000)) for _ in range(3)])
        assert s.max_offset("orders", 0) == 4
