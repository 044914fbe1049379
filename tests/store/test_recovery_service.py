"""Recovery on a closed store's parts, with a scan of its own in place of the dispatcher.

A MessageStore writes and closes the store; the tests then open its CommitLog,
ConsumeQueues, index, checkpoint, state and topics.json directly and run
Recovery over them, the redispatch a plain scan that records where it ran.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from rocketspark.errors import StoreDamagedError
from rocketspark.message.java_hash import tags_code
from rocketspark.message.record import RECORD_INVALID, HostAddress, RecordCheck
from rocketspark.store import Message, MessageStore, MessageStoreConfig
from rocketspark.store.checkpoint import StoreCheckpoint
from rocketspark.store.commit_log import CommitLog
from rocketspark.store.consume_queue import ConsumeQueues
from rocketspark.store.index_service import IndexService
from rocketspark.store.recovery import Recovery
from rocketspark.store.store_state import ABORT_FILE, StoreState
from rocketspark.store.topic_config import TopicConfigTable

GEOMETRY = dict(
    mappedFileSizeCommitLog=1 << 16,
    mappedFileSizeConsumeQueue=20 * 64,
    maxHashSlotNum=64,
    maxIndexNum=1024,
)


@dataclasses.dataclass
class Parts:
    recovery: Recovery
    commit_log: CommitLog
    queues: ConsumeQueues
    state: StoreState
    topics: TopicConfigTable
    scans: list[tuple[int, int | None]]
    gaps: dict[tuple[str, int], int]


@pytest.fixture
def written(tmp_path) -> str:
    """A store closed cleanly: topic t of two queues, ten messages in each."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, **GEOMETRY) as s:
        s.create_topic("t", queues=2)
        for qid in (0, 1):
            s.put_batch([Message("t", b"m%d" % i, tags="a", queue_id=qid) for i in range(10)])
    return root


@pytest.fixture
def parts(written) -> Iterator[Parts]:
    p = _open(written)
    yield p
    p.queues.close()
    p.commit_log.close()
    p.recovery.index.close()
    p.recovery.checkpoint.close()
    p.state.close()


def _open(root: str) -> Parts:
    config = dataclasses.replace(
        MessageStoreConfig(),
        store_path_root_dir=root,
        mapped_file_size_commit_log=GEOMETRY["mappedFileSizeCommitLog"],
        mapped_file_size_consume_queue=GEOMETRY["mappedFileSizeConsumeQueue"],
        max_hash_slot_num=GEOMETRY["maxHashSlotNum"],
        max_index_num=GEOMETRY["maxIndexNum"],
    )
    commit_log = CommitLog(
        root, config.mapped_file_size_commit_log, HostAddress.parse("127.0.0.1", 10911)
    )
    topics = TopicConfigTable(os.path.join(root, "config"))
    queues = ConsumeQueues(root, config.mapped_file_size_consume_queue, topics)
    scans: list[tuple[int, int | None]] = []
    gaps: dict[tuple[str, int], int] = {}

    def redispatch(start: int, end: int | None, *, index_from: int | None = None):
        """A scan that dispatches nothing: where the valid records end, and why."""
        scans.append((start, end))
        pos, reason = start, ""
        for pos, check in commit_log.scan(start, verify_crc=True):
            if (end is not None and pos >= end) or check.size <= 0:
                reason = check.reason if check.size == RECORD_INVALID else ""
                break
        return pos, reason

    def queue_code(check: RecordCheck) -> int:
        return tags_code(check.tags)

    state = StoreState(root)
    recovery = Recovery(
        root=root,
        config=config,
        state=state,
        commit_log=commit_log,
        checkpoint=StoreCheckpoint(os.path.join(root, "checkpoint")),
        index=IndexService(
            os.path.join(root, "index"),
            hash_slot_num=config.max_hash_slot_num,
            index_num=config.max_index_num,
        ),
        queues=queues,
        topics=topics,
        redispatch=redispatch,
        queue_code=queue_code,
        gaps=gaps,
    )
    return Parts(recovery, commit_log, queues, state, topics, scans, gaps)


def test_after_a_clean_close_recovery_verifies_the_end_only(parts):
    end = parts.state.commit_pos
    report = parts.recovery.recover()
    assert parts.scans == [(end, None)]
    assert not report.abnormal_exit and report.scanned_from is None
    assert report.commit_end == end and report.damage is None
    assert os.path.exists(os.path.join(parts.recovery.root, ABORT_FILE))


def test_a_full_recovery_scans_from_the_first_segment(parts):
    report = parts.recovery.recover(full=True)
    assert parts.scans[0] == (parts.commit_log.files.min_offset, None)
    assert report.scanned_from == parts.commit_log.files.min_offset


def test_a_torn_tail_is_zeroed_and_the_queue_entries_past_it_dropped(parts):
    state = parts.state
    end = state.commit_pos
    last = parts.queues.queue("t", 1).entry(9)
    assert last is not None and last[0] + last[1] == end
    # As a crash mid-append leaves it: COMMIT_POS back before the last record,
    # whose bytes are torn (its body CRC fails).
    state.commit_pos = state.dispatched_pos = state.flushed_pos = last[0]
    state.pending_end = end
    seg = parts.commit_log.segment(last[0])
    body = seg.mm.find(b"m9", last[0] - seg.start_offset, end - seg.start_offset)
    seg.mm[body] ^= 0xFF
    report = parts.recovery.recover()
    assert report.commit_end == last[0] and report.discarded_bytes >= last[1]
    assert report.truncated_queue_entries == 1
    assert parts.queues.queue("t", 1).max_offset() == 9
    assert state.commit_pos == state.dispatched_pos == last[0]


def test_rebuild_queues_rewrites_a_queue_from_its_first_missing_entry(parts):
    q = parts.queues.queue("t", 0)
    phys = [q.entry(i)[0] for i in range(10)]
    # A hole at entry 4 (its record is in the CommitLog): 5-9 sit behind it, unread.
    q.zero_from(4, 10)
    q.put(5, phys[5:], [q.entry(0)[1]] * 5, [tags_code("a")] * 5)
    parts.gaps[("t", 0)] = 4
    done = parts.recovery.rebuild_queues(parts.state.commit_pos)
    assert done == [("t", 0, 4, 10)]
    assert parts.gaps == {}  # the shared map is emptied, not replaced
    assert [q.entry(i)[0] for i in range(10)] == phys
    assert q.max_offset() == 10


def test_damage_error_names_the_damage_the_state_records(parts):
    state = parts.state
    state.damage_pos, state.damage_resume, state.damage_following = 128, 512, 3
    err = parts.recovery.damage_error()
    assert isinstance(err, StoreDamagedError)
    assert (err.offset, err.resume, err.following) == (128, 512, 3)
    assert "recover --truncate-at 128" in str(err)


def test_topics_with_queues_on_disk_but_not_in_topics_json_are_adopted(parts):
    base = os.path.join(parts.recovery.root, "consumequeue")
    for qid in (0, 2):
        os.makedirs(os.path.join(base, "found", str(qid)))
    os.makedirs(os.path.join(base, "bad name!", "0"))
    parts.recovery.adopt_unlisted_topics()
    cfg = parts.topics.get("found")
    assert cfg is not None and (cfg["readQueueNums"], cfg["writeQueueNums"]) == (3, 3)
    assert parts.topics.get("bad name!") is None
