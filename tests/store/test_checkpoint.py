"""The checkpoint file: flush timestamps in RocketMQ's 4 KiB big-endian layout."""

from __future__ import annotations

import os
import struct

from rocketspark.store.checkpoint import CHECKPOINT, CHECKPOINT_SIZE, StoreCheckpoint


def test_a_new_checkpoint_is_one_zeroed_page(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    try:
        assert cp.read() == (0, 0, 0, 0, 0)
        assert cp.min_timestamp == 0
    finally:
        cp.close()
    assert os.path.getsize(path) == CHECKPOINT_SIZE == 4096
    with open(path, "rb") as f:
        assert f.read() == bytes(CHECKPOINT_SIZE)


def test_timestamps_round_trip_through_the_file_in_rocketmqs_layout(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path)
    cp.update(physic=1_700_000_000_300, logics=1_700_000_000_200, index=1_700_000_000_100)
    cp.update(confirm_phy_offset=4096)
    cp.flush()
    cp.close()
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:40] == struct.pack(
        ">qqqqq", 1_700_000_000_300, 1_700_000_000_200, 1_700_000_000_100, 0, 4096
    )
    assert CHECKPOINT.size == 40 and raw[40:] == bytes(CHECKPOINT_SIZE - 40)
    again = StoreCheckpoint(path)
    try:
        assert again.physic_msg_timestamp == 1_700_000_000_300
        assert again.logics_msg_timestamp == 1_700_000_000_200
        assert again.index_msg_timestamp == 1_700_000_000_100
        assert again.min_timestamp == 1_700_000_000_200
        assert again.read()[4] == 4096
    finally:
        again.close()


def test_timestamps_never_go_backwards_but_the_confirm_offset_is_set(tmp_path):
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"))
    try:
        cp.update(physic=200, logics=300, index=400, confirm_phy_offset=100)
        cp.update(physic=100, logics=None, index=500, confirm_phy_offset=50)
        assert cp.read() == (200, 300, 500, 0, 50)
    finally:
        cp.close()


def test_a_short_checkpoint_is_grown_to_a_page_keeping_its_bytes(tmp_path):
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">qqq", 7, 8, 9))
    cp = StoreCheckpoint(str(path))
    try:
        assert cp.read() == (7, 8, 9, 0, 0)
    finally:
        cp.close()
    assert path.stat().st_size == CHECKPOINT_SIZE
