"""The shared state file: checked positions, the intent record, the header."""

from __future__ import annotations

import os
import zlib

import pytest

from rocketspark.store.store_state import (
    CHECKED_FIELDS,
    COMMIT_POS_OFFSET,
    INTENT_OFFSET,
    STATE_FILE,
    STATE_FORMAT_VERSION,
    STATE_HEADER,
    STATE_MAGIC,
    STATE_SIZE,
    WRITE_SEQ_OFFSET,
    StoreState,
    check_ok,
)

FIELDS = {
    "COMMIT_POS": "commit_pos",
    "PENDING_END": "pending_end",
    "DISPATCHED_POS": "dispatched_pos",
    "FLUSHED_POS": "flushed_pos",
    "SYNCED_POS": "synced_pos",
    "HOLDERS": "holders",
    "DAMAGE_POS": "damage_pos",
    "DAMAGE_RESUME": "damage_resume",
    "DAMAGE_FOLLOWING": "damage_following",
}


@pytest.fixture
def state(tmp_path):
    s = StoreState(str(tmp_path))
    yield s
    s.close()


def test_a_new_state_file_is_untrusted_until_initialised(tmp_path, state):
    assert not state.existed and not state.valid and state.format_version is None
    assert state.damaged_fields() == list(CHECKED_FIELDS)
    assert os.path.getsize(tmp_path / STATE_FILE) == STATE_SIZE
    state.initialise()
    assert state.valid and state.format_version == STATE_FORMAT_VERSION
    assert state.damaged_fields() == []
    assert all(getattr(state, attr) == 0 for attr in FIELDS.values())
    assert state.write_seq == 0 and state.intent() == (0, 0, 0, 0)


def test_the_header_and_the_fields_sit_where_the_layout_says(tmp_path, state):
    state.initialise()
    state.commit_pos = 0x123456789A
    state.write_seq = -1
    state.flush()
    raw = (tmp_path / STATE_FILE).read_bytes()
    assert STATE_HEADER.unpack_from(raw, 0) == (STATE_MAGIC, STATE_FORMAT_VERSION, 0)
    word = raw[COMMIT_POS_OFFSET : COMMIT_POS_OFFSET + 8]
    assert word[2:] == (0x123456789A).to_bytes(6, "big")
    assert word[:2] == (zlib.crc32(word[2:]) & 0xFFFF).to_bytes(2, "big") and check_ok(word)
    assert raw[WRITE_SEQ_OFFSET : WRITE_SEQ_OFFSET + 8] == b"\xff" * 8


def test_every_checked_field_round_trips_and_survives_a_reopen(tmp_path, state):
    state.initialise()
    for i, attr in enumerate(FIELDS.values(), 1):
        setattr(state, attr, i * 1_000_003)
    state.write_seq = 42
    state.set_intent(3, 10, 20, 4096)
    state.flush()
    again = StoreState(str(tmp_path))
    try:
        assert again.existed and again.valid and again.damaged_fields() == []
        for i, attr in enumerate(FIELDS.values(), 1):
            assert getattr(again, attr) == i * 1_000_003
        assert again.write_seq == 42 and again.intent() == (3, 10, 20, 4096)
        again.clear_intent()
        assert again.intent() == (0, 0, 0, 0)
    finally:
        again.close()


@pytest.mark.parametrize("name", list(CHECKED_FIELDS))
def test_a_flipped_bit_in_a_field_names_that_field_only(tmp_path, state, name):
    assert set(FIELDS) == set(CHECKED_FIELDS)
    state.initialise()
    setattr(state, FIELDS[name], 5000)
    state.flush()
    state.close()
    path = tmp_path / STATE_FILE
    raw = bytearray(path.read_bytes())
    raw[CHECKED_FIELDS[name] + 7] ^= 0x04
    path.write_bytes(bytes(raw))
    again = StoreState(str(tmp_path))
    try:
        assert again.valid and again.damaged_fields() == [name]
        assert not check_ok(raw[CHECKED_FIELDS[name] : CHECKED_FIELDS[name] + 8])
    finally:
        again.close()


def test_stamp_trusts_a_file_whose_fields_were_rewritten(tmp_path, state):
    (tmp_path / STATE_FILE).write_bytes(bytes(STATE_SIZE))
    s = StoreState(str(tmp_path))
    try:
        assert s.existed and not s.valid
        for attr in FIELDS.values():
            setattr(s, attr, 7)
        s.stamp()
        assert s.valid and s.damaged_fields() == [] and s.commit_pos == 7
    finally:
        s.close()
    assert INTENT_OFFSET > WRITE_SEQ_OFFSET


# --- the store lock and the write lock --------------------------------------------------


def test_the_first_holder_recovers_later_ones_share_and_the_last_shuts_down(tmp_path):
    from rocketspark.store.store_state import StoreLock

    first, second = StoreLock(str(tmp_path)), StoreLock(str(tmp_path))
    assert first.acquire() is True and first.first
    first.downgrade()
    assert second.acquire() is False and not second.first
    assert not first.replaced() and not second.replaced()
    assert first.release() is False  # another instance still holds the store
    assert second.release() is True  # the last one: shut down cleanly
    second.release_final()
    assert second.release() is False  # released once only
    again = StoreLock(str(tmp_path))
    assert again.acquire() is True  # the next open recovers again
    again.release()
    again.release_final()


def test_a_store_deleted_and_made_again_at_its_path_is_another_store(tmp_path):
    from rocketspark.store.store_state import LOCK_FILE, StoreLock

    lock = StoreLock(str(tmp_path))
    assert lock.acquire()
    os.unlink(tmp_path / LOCK_FILE)
    (tmp_path / LOCK_FILE).write_bytes(b"")
    assert lock.replaced()
    assert lock.release() is True
    lock.release_final()


def test_the_write_lock_excludes_another_thread_until_released(tmp_path):
    import threading

    from rocketspark.store.store_state import WRITE_LOCK_FILE, WriteLock

    lock = WriteLock(str(tmp_path))
    assert lock.path == str(tmp_path / WRITE_LOCK_FILE)
    got: list[bool] = []
    with lock:
        t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.05)))
        t.start()
        t.join()
    assert got == [False]
    assert lock.acquire(timeout=1.0) is True
    lock.release()
    lock.close()
