"""Recovery finds the end of the data from the CommitLog itself, whoever wrote it.

The state file only hints where to start; damage followed by valid records is
reported and never cut silently; ConsumeQueue holes are rebuilt; a process
that may exit without close() (a Spark worker) does not leave the store
looking crashed. Stores are built and damaged with raw bytes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rocketspark.errors import RocketSparkError
from rocketspark.message.properties import encode_properties
from rocketspark.message.record import HostAddress, check_record, encode_record
from rocketspark.store import Message, MessageStore
from rocketspark.store.store_check import check_store
from rocketspark.store.store_state import StoreState
from tests.store.helpers.writer import SMALL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEG = SMALL["mappedFileSizeCommitLog"]
HOST = HostAddress.parse("10.0.0.9", 10911)
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _build(root, n=60, queues=2):
    """A store of ``n`` messages over ``queues`` queues, closed cleanly; their results."""
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=queues)
        return list(s.put_batch([Message("t", b"m%03d" % i, keys=[f"k{i}"]) for i in range(n)]))


def _bodies(s, topic="t"):
    out = []
    for q in range(s.topic(topic).read_queue_nums):
        off = 0
        while True:
            res = s.pull(topic, q, off, max_msgs=256)
            if not res.messages:
                break
            for i, m in enumerate(res.messages):
                assert (m.topic, m.queue_id, m.queue_offset) == (topic, q, off + i)
            out += [m.body for m in res.messages]
            off = res.next_offset
    return sorted(out)


def _segment(root, start=0):
    return os.path.join(root, "commitlog", f"{start:020d}")


def _patch(path, at, data):
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _flip(path, at, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ mask]))


def _touch_abort(root):
    open(os.path.join(root, "abort"), "wb").close()


def _as_format_1(root, pos=None):
    """Leave the state file as a rocketspark before checked fields wrote it (every
    position ``pos``, by default the end of the data)."""
    import struct

    if pos is None:
        state = StoreState(root)
        pos = state.commit_pos
        state.close()
    path = os.path.join(root, "rocketspark.state")
    raw = bytearray(open(path, "rb").read())
    struct.pack_into(">8sii", raw, 0, b"RSPKSTAT", 1, 0)
    for off in (16, 24, 32, 40, 56):
        struct.pack_into(">q", raw, off, pos)
    open(path, "wb").write(bytes(raw))


def _crash(root):
    """Leave the store as a process that had to close() it and died leaves it."""
    _touch_abort(root)
    state = StoreState(root)
    state.holders = 1
    state.close()


# -- the state file is a hint -----------------------------------------------------------


@SETTINGS
@given(
    field=st.sampled_from([16, 24, 32, 40, 56]),
    pick=st.integers(0, 63),
    lower=st.booleans(),
    crashed=st.booleans(),
)
def test_one_flipped_bit_in_the_state_file_loses_nothing(
    tmp_path_factory, field, pick, lower, crashed
):
    """COMMIT_POS, PENDING_END, DISPATCHED_POS, FLUSHED_POS or SYNCED_POS with any bit
    flipped (``lower``: one of the position's set bits, which moves it back, often to
    mid-record): every acknowledged message is still there, the next put follows."""
    root = str(tmp_path_factory.mktemp("s") / "s")
    results = _build(root)
    end = results[-1].commitlog_offset + results[-1].store_size
    if lower:
        set_bits = [b for b in range(48) if end >> b & 1]
        bit = set_bits[pick % len(set_bits)]
    else:
        bit = pick
    _flip(os.path.join(root, "rocketspark.state"), field + 7 - bit // 8, 1 << (bit % 8))
    if crashed:
        _touch_abort(root)
    with MessageStore.open(root, **SMALL) as s:
        assert _bodies(s) == sorted(b"m%03d" % i for i in range(60))
        r = s.put(Message("t", b"next", queue_id=0))
        assert r.commitlog_offset == end
        assert r.queue_offset == 30
        assert s.get_message(results[10].commitlog_offset).body == b"m010"


@SETTINGS
@given(data=st.data(), crashed=st.booleans())
def test_positions_the_state_claims_never_cut_a_verified_record(tmp_path_factory, data, crashed):
    """Whatever positions a (well-formed) state file claims, mid-record included,
    no record that verifies is cut and none is hidden from its queue."""
    root = str(tmp_path_factory.mktemp("s") / "s")
    results = _build(root)
    end = results[-1].commitlog_offset + results[-1].store_size
    commit = data.draw(st.integers(0, end), label="COMMIT_POS")
    dispatched = data.draw(st.integers(0, end), label="DISPATCHED_POS")
    flushed = data.draw(st.integers(0, end), label="FLUSHED_POS")
    st_ = StoreState(root)
    st_.commit_pos = st_.pending_end = commit
    st_.dispatched_pos, st_.flushed_pos = dispatched, flushed
    st_.close()
    if crashed:
        _touch_abort(root)
    with MessageStore.open(root, **SMALL) as s:
        assert _bodies(s) == sorted(b"m%03d" % i for i in range(60))
        r = s.put(Message("t", b"next", queue_id=1))
        assert (r.commitlog_offset, r.queue_offset) == (end, 30)


def test_a_damaged_state_file_is_reported_and_rebuilt(tmp_path):
    root = str(tmp_path / "s")
    _build(root)
    _flip(os.path.join(root, "rocketspark.state"), 20, 0x10)  # COMMIT_POS
    report = check_store(root)
    assert any("COMMIT_POS" in p and "fail" in p for p in report.problems)
    with MessageStore.open(root, **SMALL) as s:
        assert s.recovery_report.state_damaged == ["COMMIT_POS"]
        assert len(_bodies(s)) == 60
    with MessageStore.open(root, **SMALL) as s:  # rewritten whole: trusted again
        assert s.recovery_report.state_damaged == [] and s.recovery_report.scanned_from is None
    assert check_store(root).ok


@pytest.mark.parametrize("field", ["COMMIT_POS", "DISPATCHED_POS", "FLUSHED_POS"])
def test_a_damaged_field_leaves_the_intact_flushed_pos_a_hint(tmp_path, field):
    """Only FLUSHED_POS (the lowest position: dispatched and on disk before it), once the
    CommitLog confirms it, spares a scan from a segment start."""
    from rocketspark.store.store_state import CHECKED_FIELDS

    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=2)
        results = s.put_batch([Message("t", b"m%03d" % i + b"p" * 300) for i in range(500)])
    end = results[-1].commitlog_offset + results[-1].store_size
    assert end > 2 * SEG
    _flip(os.path.join(root, "rocketspark.state"), CHECKED_FIELDS[field] + 5, 0x10)
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.state_damaged == [field] and rep.damage is None and rep.commit_end == end
        if field == "FLUSHED_POS":
            assert rep.scanned_from % SEG == 0 and rep.scanned_from < end
        else:
            assert rep.scanned_from == end
        assert len(_bodies(s)) == 500
        assert s.put(Message("t", b"n")).commitlog_offset == end
    assert check_store(root).ok


# -- records another writer appended -------------------------------------------------------


def _foreign(root, pos, topic, queue_id, queue_offset, body, ts=1_700_000_000_000):
    """Append a broker's record at CommitLog ``pos``; return where it ends."""
    props = encode_properties({"UNIQ_KEY": f"FOREIGN{queue_offset:08d}", "KEYS": f"f{body}"})
    raw = encode_record(
        topic=topic,
        queue_id=queue_id,
        body=body.encode(),
        properties=props,
        queue_offset=queue_offset,
        physical_offset=pos,
        born_timestamp=ts,
        born_host=HOST,
        store_timestamp=ts,
        store_host=HOST,
    )
    seg = pos - pos % SEG
    _patch(_segment(root, seg), pos - seg, raw)
    return pos + len(raw)


def test_records_a_broker_appended_after_a_clean_close_are_dispatched_not_overwritten(tmp_path):
    """rocketspark writes, a broker appends (killed before it built its ConsumeQueue),
    rocketspark opens again: the broker's records are read, the next put goes after."""
    root = str(tmp_path / "s")
    results = _build(root, n=20)
    pos = results[-1].commitlog_offset + results[-1].store_size
    for i in range(8):
        pos = _foreign(root, pos, "t", i % 2, 10 + i // 2, f"broker{i}")
    with MessageStore.open(root, **SMALL) as s:
        assert _bodies(s) == sorted(
            [b"m%03d" % i for i in range(20)] + [b"broker%d" % i for i in range(8)]
        )
        r = s.put(Message("t", b"after", queue_id=0))
        assert (r.commitlog_offset, r.queue_offset) == (pos, 14)
        assert [m.body for m in s.query_by_key("t", "fbroker3")] == [b"broker3"]
    assert check_store(root).ok


def test_a_broker_killed_with_a_preallocated_empty_segment_loses_nothing(tmp_path):
    """A broker's store (no rocketspark.state), SIGKILLed: records it had not yet put
    in its ConsumeQueue, then an all-zero preallocated next segment. The scan never
    starts at that segment, and the next put follows the last record."""
    root = str(tmp_path / "s")
    results = _build(root, n=20)
    pos = results[-1].commitlog_offset + results[-1].store_size
    for i in range(5):
        pos = _foreign(root, pos, "t", 0, 10 + i, f"late{i}")
    os.unlink(os.path.join(root, "rocketspark.state"))
    with open(_segment(root, SEG), "wb") as f:
        f.truncate(SEG)  # preallocated, all zeros
    _touch_abort(root)
    from rocketspark.store.checkpoint import StoreCheckpoint

    cp = StoreCheckpoint(os.path.join(root, "checkpoint"))
    cp.update(physic=2_000_000_000_000, logics=2_000_000_000_000)  # after every record
    cp.flush()
    cp.close()
    with MessageStore.open(root, **SMALL) as s:
        assert _bodies(s) == sorted(
            [b"m%03d" % i for i in range(20)] + [b"late%d" % i for i in range(5)]
        )
        r = s.put(Message("t", b"after", queue_id=0))
        assert (r.commitlog_offset, r.queue_offset) == (pos, 15)


# -- damage followed by valid records ------------------------------------------------------


@SETTINGS
@given(victim=st.integers(5, 50), byte=st.integers(0, 200), crashed=st.booleans())
@example(victim=5, byte=93, crashed=False)  # the topic's byte: verifies, names another topic
@example(victim=5, byte=13, crashed=False)  # QUEUEID: verifies, names a queue t lacks
def test_damage_followed_by_valid_records_is_reported_never_cut(
    tmp_path_factory, victim, byte, crashed
):
    """Any byte of a record in the middle flipped, the state lost (scan from the
    start): recovery cuts nothing; when the record no longer verifies, reads still
    work and writes are refused naming the file, the offset and how many valid
    records follow."""
    root = str(tmp_path_factory.mktemp("s") / "s")
    results = _build(root)
    seg = _segment(root)
    at = results[victim].commitlog_offset
    size = results[victim].store_size
    _flip(seg, at + byte % size, 0xFF)
    with open(seg, "rb") as f:
        before = f.read()
    # A flip in a field no check covers (QUEUEID, timestamps, hosts) still verifies.
    verifies = check_record(before, at, at).size > 0
    os.unlink(os.path.join(root, "rocketspark.state"))
    if crashed:
        _touch_abort(root)
    with MessageStore.open(root, **SMALL) as s:
        with open(seg, "rb") as f:
            assert f.read() == before  # nothing zeroed
        assert s.get_message(results[-1].commitlog_offset).body == b"m059"
        assert s.pull("t", 0, 0, 1).messages[0].body == b"m000"  # before the damage
        dmg = s.recovery_report.damage
        if verifies:
            assert dmg is None
            return
        assert dmg is not None and dmg.offset == at and dmg.following == 60 - victim - 1
        assert dmg.resume == results[victim + 1].commitlog_offset
        with pytest.raises(RocketSparkError) as exc:
            s.put(Message("t", b"refused"))
        text = str(exc.value)
        assert str(at) in text and os.path.basename(seg) in text
        assert f"{60 - victim - 1} valid record(s)" in text
    report = check_store(root)
    assert any(
        f"damaged at offset {at}" in p and f"{60 - victim - 1} valid record(s)" in p
        for p in report.problems
    )


def test_writes_are_refused_in_every_process_until_an_explicit_truncate(tmp_path):
    root = str(tmp_path / "s")
    results = _build(root)
    at = results[30].commitlog_offset
    _flip(_segment(root), at + 90, 0x04)  # a body byte: CRC mismatch
    os.unlink(os.path.join(root, "rocketspark.state"))
    _touch_abort(root)
    from rocketspark.cli import main

    with MessageStore.open(root, **SMALL) as s:
        code = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from rocketspark.store import Message, "
                "MessageStore; s = MessageStore.open(sys.argv[1], mappedFileSizeCommitLog=65536,"
                " mappedFileSizeConsumeQueue=10240, maxHashSlotNum=512, maxIndexNum=4096); "
                "s.put(Message('t', b'x'))",
                root,
            ],
            cwd=ROOT,
            capture_output=True,
            timeout=120,
        )
        assert code.returncode != 0 and b"StoreDamagedError" in code.stderr
        assert s.recovery_report.damage.following == 29
    with MessageStore.open(root, **SMALL) as s:  # still damaged: found again
        assert s.recovery_report.damage.offset == at
    import io

    out = io.StringIO()
    conf = str(tmp_path / "broker.conf")
    with open(conf, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in SMALL.items()))
    assert (
        main(["--config", conf, "store", "recover", root, "--truncate-at", str(at + 1)], out) == 2
    )
    assert main(["--config", conf, "store", "recover", root, "--truncate-at", str(at)], out) == 0
    assert "discarded 29 valid record(s)" in out.getvalue()
    with MessageStore.open(root, **SMALL) as s:
        assert s.recovery_report.damage is None
        assert _bodies(s) == sorted(b"m%03d" % i for i in range(30))
        r = s.put(Message("t", b"new", queue_id=0))
        assert r.commitlog_offset == at and r.queue_offset == 15
    assert check_store(root).ok


def test_a_torn_tail_with_nothing_valid_after_it_is_still_cut(tmp_path):
    """(A guard: what recovery always did, it still does.)"""
    root = str(tmp_path / "s")
    results = _build(root)
    last = results[-1]
    _flip(_segment(root), last.commitlog_offset + 89, 0x01)  # a body byte
    os.unlink(os.path.join(root, "rocketspark.state"))
    _touch_abort(root)
    with MessageStore.open(root, **SMALL) as s:
        assert getattr(s.recovery_report, "damage", None) is None
        assert s.recovery_report.commit_end == last.commitlog_offset
        assert len(_bodies(s)) == 59
        assert s.put(Message("t", b"n")).commitlog_offset == last.commitlog_offset


def test_zeros_in_the_middle_followed_by_records_are_damage(tmp_path):
    """A lost page (an OS crash wrote a later page but not this one)."""
    root = str(tmp_path / "s")
    results = _build(root)
    at = results[20].commitlog_offset
    _patch(_segment(root), at, bytes(results[20].store_size + results[21].store_size))
    os.unlink(os.path.join(root, "rocketspark.state"))
    with MessageStore.open(root, **SMALL) as s:
        dmg = s.recovery_report.damage
        assert (dmg.offset, dmg.resume, dmg.following) == (at, results[22].commitlog_offset, 38)


# -- ConsumeQueue holes ---------------------------------------------------------------------


def _put_after_a_refused_put(s, n_before, n_after, queue_id=0, holes=1):
    """Old code's refused put: a queue offset taken, nothing written."""
    for i in range(n_before):
        s.put(Message("t", b"a%d" % i, queue_id=queue_id))
    with s.appender.locked() as append:
        append.reserve_queue_offsets("t", queue_id, holes)
    for i in range(n_after):
        s.put(Message("t", b"b%d" % i, queue_id=queue_id))


@pytest.mark.parametrize("holes", [1, 3])
@pytest.mark.parametrize("left_by", ["crash", "old code"])
def test_a_consumequeue_hole_is_rebuilt_on_the_next_open(tmp_path, holes, left_by):
    """A hole reaches an open after a crash, or in a store the old code wrote (its
    refused puts left them). After an orderly end of this code's processes there can
    be none (a refused put gives its offsets back), so such opens do not walk the
    queues: that walk would cost a store of many queues more than the rest of the open."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
        _put_after_a_refused_put(s, 3, 4, holes=holes)
    if left_by == "crash":
        _crash(root)
    else:  # closed cleanly by the older rocketspark that made the hole
        _as_format_1(root)
    assert any("hole" in p for p in check_store(root).problems)
    with MessageStore.open(root, **SMALL) as s:
        assert s.max_offset("t", 0) == 7
        msgs = s.pull("t", 0, 0, 20).messages
        assert [m.body for m in msgs] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2", b"b3"]
        assert [m.queue_offset for m in msgs] == list(range(7))  # renumbered
        assert s.put(Message("t", b"c", queue_id=0)).queue_offset == 7
    assert check_store(root).ok


def test_an_open_after_a_clean_shutdown_maps_no_consumequeue(tmp_path):
    """Hole checks cost a mapping per queue; after a clean close there is none to find."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        for t in range(20):
            s.create_topic(f"t{t}", queues=4)
            s.put_batch([Message(f"t{t}", b"x", queue_id=q) for q in range(4)])
    with MessageStore.open(root, **SMALL) as s:
        assert s.recovery_report.scanned_from is None
        assert not s.queues
        assert s.max_offset("t7", 3) == 1


def test_a_hole_in_an_earlier_consumequeue_file_is_rebuilt_after_a_crash(tmp_path):
    root = str(tmp_path / "s")
    per_file = SMALL["mappedFileSizeConsumeQueue"] // 20
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
        _put_after_a_refused_put(s, 10, per_file + 20)
    _crash(root)
    with MessageStore.open(root, **SMALL) as s:
        assert s.max_offset("t", 0) == per_file + 30
        assert len(s.pull("t", 0, 0, 1000).messages) == per_file + 30
    assert check_store(root).ok


_KILLED_REBUILD = """
import os, signal, sys
from rocketspark.store import MessageStore
from rocketspark.store.commit_log import CommitLog
from tests.store.helpers.writer import SMALL
rewrite, left = CommitLog.set_queue_offset, [int(sys.argv[2])]
def killing(self, pos, queue_offset):
    rewrite(self, pos, queue_offset)
    left[0] -= 1
    if not left[0]:
        os.kill(os.getpid(), signal.SIGKILL)  # renumbered, its entry not yet written
CommitLog.set_queue_offset = killing
MessageStore.open(sys.argv[1], **SMALL)
"""


@pytest.mark.parametrize("kill_after", [1, 3, 6])
def test_a_rebuild_killed_half_way_is_finished_by_the_next_open(tmp_path, kill_after):
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
        _put_after_a_refused_put(s, 3, 6, holes=2)
    _as_format_1(root)  # the older rocketspark that made the hole closed cleanly
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_REBUILD, root, str(kill_after)],
        cwd=ROOT,
        capture_output=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with MessageStore.open(root, **SMALL) as s:
        assert s.max_offset("t", 0) == 9
        msgs = s.pull("t", 0, 0, 20).messages
        assert [m.body for m in msgs] == [b"a0", b"a1", b"a2"] + [b"b%d" % i for i in range(6)]
        assert [m.queue_offset for m in msgs] == list(range(9))
    assert check_store(root).ok


def test_store_recover_rebuilds_entries_a_consumequeue_lost(tmp_path):
    root = str(tmp_path / "s")
    _build(root, n=40, queues=1)
    cq = os.path.join(root, "consumequeue", "t", "0", f"{0:020d}")
    _patch(cq, 30 * 20, bytes(10 * 20))  # the last 10 entries lost
    assert any("has 30 entries" in p for p in check_store(root).problems)
    import io

    from rocketspark.cli import main

    conf = str(tmp_path / "broker.conf")
    with open(conf, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in SMALL.items()))
    assert main(["--config", conf, "store", "recover", root], io.StringIO()) == 0
    assert check_store(root).ok
    with MessageStore.open(root, **SMALL) as s:
        assert len(s.pull("t", 0, 0, 100).messages) == 40


# -- the abort marker -----------------------------------------------------------------------


_CHILD = """
import os, sys
from rocketspark.client import ClientRef
from rocketspark.store import Message, MessageStore
root, how = sys.argv[1], sys.argv[2]
conf = dict(mappedFileSizeCommitLog="65536", mappedFileSizeConsumeQueue="10240",
            maxHashSlotNum="512", maxIndexNum="4096")
if how == "worker":
    s = ClientRef("embedded", root, tuple(sorted(conf.items()))).connect().store
else:
    s = MessageStore.open(root, **conf)
s.put(Message("t", b"from-" + how.encode()))
os._exit(0)  # as a Spark Python worker ends: no close(), no atexit
"""


@pytest.mark.parametrize("how", ["worker", "direct"])
def test_a_worker_ending_without_close_is_not_a_crash_but_a_direct_user_is(tmp_path, how):
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
    live = MessageStore.open(root, **SMALL)  # another process keeps it open meanwhile
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, root, how], cwd=ROOT, capture_output=True, timeout=120
    )
    assert child.returncode == 0, child.stderr.decode()
    live.close()
    assert not os.path.exists(os.path.join(root, "abort"))
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, root, how], cwd=ROOT, capture_output=True, timeout=120
    )
    assert child.returncode == 0, child.stderr.decode()
    assert os.path.exists(os.path.join(root, "abort"))  # a broker still sees a crash
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.abnormal_exit == (how == "direct")
        assert not rep.discarded_bytes and not rep.truncated_queue_entries
        assert [m.body for m in s.pull("t", 0, 0).messages] == [b"from-" + how.encode()] * 2


def test_a_sigkilled_worker_inside_an_append_is_still_a_crash(tmp_path):
    """A process that may exit without close() but dies inside an append."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
        s.put(Message("t", b"kept"))
    script = (
        "import os, signal, sys\n"
        "from rocketspark.store import Message, MessageStore, commit_log\n"
        "s = MessageStore.open(sys.argv[1], exit_without_close=True,"
        " mappedFileSizeCommitLog='65536', mappedFileSizeConsumeQueue='10240',"
        " maxHashSlotNum='512', maxIndexNum='4096')\n"
        "w = commit_log.CommitLog.write\n"
        "def die(self, writes):\n"
        "    w(self, writes); os.kill(os.getpid(), signal.SIGKILL)\n"
        "commit_log.CommitLog.write = die\n"
        "s.put_batch([Message('t', b'lost%d' % i) for i in range(3)])\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, root], cwd=ROOT, capture_output=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.abnormal_exit and rep.reason == "unfinished append"
        assert [m.body for m in s.pull("t", 0, 0).messages] == [b"kept"]


_KILLED_AFTER_HEADERS = """
import os, signal, sys
from rocketspark.store import MessageStore, commit_log
from tests.store.helpers.writer import SMALL
s = MessageStore.open(sys.argv[1], **SMALL)
copy = commit_log.interleave_rows
def headers_only(columns, widths, out):
    copy(columns, widths, out)
    out.reshape(-1, sum(widths))[:, widths[0]:] = 0  # bodies and the rest not copied yet
    os.kill(os.getpid(), signal.SIGKILL)
commit_log.interleave_rows = headers_only
s.put_columns([b"u%05d" % i for i in range(3000)], topic="t", queue_ids=[0] * 3000)
"""


def test_a_torn_record_at_commit_pos_keeps_the_state_trusted(tmp_path, caplog):
    """A writer killed after copying the records' headers (the columnar put copies column
    by column) leaves a torn record at COMMIT_POS: that is an unfinished append, not a
    reason to distrust the state and re-verify a whole segment."""
    root = str(tmp_path / "s")
    results = _build(root, n=300, queues=1)
    end = results[-1].commitlog_offset + results[-1].store_size
    assert end % SEG, "the append must start inside a segment"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_HEADERS, root],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.scanned_from == end and rep.commit_end == end and rep.damage is None
        assert "not a record boundary" not in caplog.text
        assert len(_bodies(s)) == 300
        assert s.put(Message("t", b"next")).commitlog_offset == end
    assert check_store(root).ok


_KILLED_MID_COPY = """
import os, signal, sys
from rocketspark.store import Message, MessageStore, commit_log
from tests.store.helpers.writer import SMALL
s = MessageStore.open(sys.argv[1], **SMALL)
def copied_but_the_first_bytes(self, writes):
    for at, parts in writes:
        f = self.files.find(at)
        data = b"".join(parts)
        f.mm[at - f.start_offset + 32:at - f.start_offset + len(data)] = data[32:]
    os.kill(os.getpid(), signal.SIGKILL)  # memcpy stores its first vector last
commit_log.CommitLog.write = copied_but_the_first_bytes
s.put_batch([Message("t", b"unacked%d" % i) for i in range(5)])
"""


def test_store_check_after_a_writer_killed_mid_copy_reports_no_damage(tmp_path):
    """Valid records inside an unfinished append are the open's to discard, not damage."""
    root = str(tmp_path / "s")
    _build(root, n=60, queues=2)
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_COPY, root], cwd=ROOT, capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    problems = check_store(root).problems
    assert len(problems) == 1 and problems[0].startswith("unfinished append"), problems
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.damage is None and rep.reason == "unfinished append"
        assert len(_bodies(s)) == 60
    assert check_store(root).ok


def test_an_append_a_v1_writer_died_inside_is_still_all_or_nothing(tmp_path):
    """A store whose older rocketspark writer was killed inside a put_batch (COMMIT_POS
    before it, PENDING_END after it): the upgrade discards the whole append, as that
    rocketspark did, instead of keeping its copied records."""
    root = str(tmp_path / "s")
    kept = _build(root, n=60)
    commit = kept[-1].commitlog_offset + kept[-1].store_size
    with MessageStore.open(root, **SMALL) as s:
        lost = s.put_batch([Message("t", b"unacked%d" % i) for i in range(7)])
    pending = lost[-1].commitlog_offset + lost[-1].store_size
    _as_format_1(root, commit)
    import struct

    with open(os.path.join(root, "rocketspark.state"), "r+b") as f:
        f.seek(24)  # PENDING_END
        f.write(struct.pack(">q", pending))
    _touch_abort(root)
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.commit_end == commit and rep.damage is None
        assert len(_bodies(s)) == 60
        assert s.put(Message("t", b"n")).commitlog_offset == commit
    assert check_store(root).ok


def test_a_v1_state_file_is_upgraded_without_loss(tmp_path):
    """A store last written by a rocketspark whose state had no checks."""
    root = str(tmp_path / "s")
    results = _build(root)
    end = results[-1].commitlog_offset + results[-1].store_size
    import struct

    raw = bytearray(open(os.path.join(root, "rocketspark.state"), "rb").read())
    struct.pack_into(">8sii", raw, 0, b"RSPKSTAT", 1, 0)
    for off in (16, 24, 32, 40, 56):
        struct.pack_into(">q", raw, off, end)
    open(os.path.join(root, "rocketspark.state"), "wb").write(bytes(raw))
    with MessageStore.open(root, **SMALL) as s:
        assert len(_bodies(s)) == 60
        assert s.put(Message("t", b"n")).commitlog_offset == end
    assert check_store(root).ok
    shutil.rmtree(root)


@SETTINGS
@given(data=st.data())
def test_a_v1_state_is_a_hint_not_damage(tmp_path_factory, data):
    """An older rocketspark's state (no checks) is no damage to report; its end,
    once the CommitLog confirms it, spares the upgrade a scan of the whole log."""
    root = str(tmp_path_factory.mktemp("v1") / "s")
    results = _build(root)
    ends = [r.commitlog_offset + r.store_size for r in results]
    end = ends[-1]
    claim = data.draw(st.one_of(st.just(end), st.sampled_from(ends), st.integers(0, end + 5000)))
    _as_format_1(root, claim)
    with MessageStore.open(root, **SMALL) as s:
        rep = s.recovery_report
        assert rep.state_damaged == [] and rep.damage is None
        if claim == end:
            assert rep.scanned_from == end
        assert len(_bodies(s)) == 60
        assert s.put(Message("t", b"n")).commitlog_offset == end
    assert check_store(root).ok


def test_a_damaged_store_leaves_its_queues_as_they_are(tmp_path):
    """A hole behind damage is not rebuilt yet: a rebuild would drop the entries of
    the records after the damage."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
        results = list(s.put_batch([Message("t", b"m%03d" % i) for i in range(50)]))
        with s.appender.locked() as append:
            append.reserve_queue_offsets("t", 0, 1)
        s.put(Message("t", b"after-hole"))
    _flip(_segment(root), results[20].commitlog_offset + 89, 0x04)
    os.unlink(os.path.join(root, "rocketspark.state"))
    with MessageStore.open(root, **SMALL) as s:
        assert s.recovery_report.damage.offset == results[20].commitlog_offset
        assert s.queues.queue("t", 0).entry(51) is not None
        assert s.get_message(s.queues.queue("t", 0).entry(51)[0]).body == b"after-hole"


@pytest.mark.parametrize("reopen", [False, True])
def test_consumequeue_files_made_ahead_of_their_entries_do_not_move_the_queue_end(tmp_path, reopen):
    """A put reserves room (ConsumeQueue files included) before it writes; refused or
    killed after that, it leaves empty files past the queue's last entry. The queue
    still ends after its last entry: the next put follows it, with no hole."""
    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        s.create_topic("t", queues=1)
        s.put_batch([Message("t", b"m%d" % i, queue_id=0) for i in range(5)])
        qdir = os.path.join(root, "consumequeue", "t", "0")
        size = SMALL["mappedFileSizeConsumeQueue"]
        for k in (1, 2):  # two files ahead, as a refused put of many entries leaves them
            with open(os.path.join(qdir, f"{k * size:020d}"), "wb") as f:
                f.truncate(size)
        if not reopen:
            # As a refused put leaves it: its offsets given back, the end read anew.
            s.queues.existing("t", 0)._max = -1
            s.appender.give_back_queue_offsets()
            assert s.put(Message("t", b"next", queue_id=0)).queue_offset == 5
    if reopen:
        with MessageStore.open(root, **SMALL) as s:
            assert s.max_offset("t", 0) == 5
            assert s.put(Message("t", b"next", queue_id=0)).queue_offset == 5
    with MessageStore.open(root, **SMALL) as s:
        assert [m.body for m in s.pull("t", 0, 0, 10).messages] == [
            b"m0",
            b"m1",
            b"m2",
            b"m3",
            b"m4",
            b"next",
        ]
    assert check_store(root).ok
