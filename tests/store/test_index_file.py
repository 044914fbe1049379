"""IndexFile: byte layout, putKey/selectPhyOffset semantics, file names.

Golden values were worked out by hand from the spec, with the Java hashCodes
taken from ``jshell``. When a JDK and the rocketmq jars ``./dev`` fetches (into
``.jars/rocketmq``) are present, RocketMQ's own ``IndexFile`` writes
files we compare byte for byte and reads files we wrote.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import struct
import subprocess
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketspark.errors import CorruptRecordError, RocketSparkError
from rocketspark.message.java_hash import java_hash_many
from rocketspark.store.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INVALID_INDEX,
    IndexFile,
    index_file_name,
    index_file_name_after,
    index_file_size,
    index_key_hash,
)
from rocketspark.store.mapped_file import INDEX_CHUNK
from tests.helpers.jvm import QUIET, need_java

SLOTS, ENTRIES = 64, 256
T0 = 1_700_000_000_123
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


def new_file(tmp_path, name="20240101000000000", slots=SLOTS, entries=ENTRIES, **kw):
    return IndexFile.create(str(tmp_path / name), hash_slot_num=slots, index_num=entries, **kw)


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def entry_at(data: bytes, slots: int, n: int) -> bytes:
    at = INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE + n * INDEX_ENTRY_SIZE
    return data[at : at + INDEX_ENTRY_SIZE]


def slot_at(data: bytes, slot: int) -> bytes:
    at = INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE
    return data[at : at + HASH_SLOT_SIZE]


# --- layout ----------------------------------------------------------------------------


def test_layout_constants_and_default_size_reserved_ahead(tmp_path):
    assert (INDEX_HEADER_SIZE, HASH_SLOT_SIZE, INDEX_ENTRY_SIZE, INVALID_INDEX) == (40, 4, 20, 0)
    assert index_file_size(5_000_000, 20_000_000) == 420_000_040
    with new_file(tmp_path, slots=5_000_000, entries=20_000_000) as f:
        assert f.put_key("T#k", 0, T0)
        f.flush()
        st_ = os.stat(f.path)
        assert st_.st_size == 420_000_040
        # The header, slot table and a chunk of entries reserved (a store into the
        # mapping never meets a full disk: SIGBUS); the rest sparse, as RocketMQ's.
        slots_end = INDEX_HEADER_SIZE + 5_000_000 * HASH_SLOT_SIZE
        assert slots_end + INDEX_CHUNK <= st_.st_blocks * 512 < slots_end + INDEX_CHUNK + (1 << 20)


def test_new_file_header_and_name(tmp_path):
    with new_file(tmp_path) as f:
        assert os.path.getsize(f.path) == 40 + SLOTS * 4 + ENTRIES * 20
        h = f.header
        assert (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset) == (
            0,
            0,
            0,
            0,
        )
        assert (h.hash_slot_count, h.index_count, f.entry_count, f.is_full) == (0, 1, 0, False)
        assert f.select_phy_offsets("T#k", 10) == []
    assert os.listdir(tmp_path) == ["20240101000000000"]  # no temporary left behind
    with pytest.raises(FileExistsError):
        new_file(tmp_path)
    assert index_file_name(1_000) == time.strftime("%Y%m%d%H%M%S", time.localtime(1)) + "000"
    assert len(index_file_name(1_700_000_000_123)) == 17
    assert index_file_name(1_700_000_000_123).endswith("123")


def testindex_file_name_after():
    assert index_file_name_after("20240101000000000") == "20240101000000001"
    assert index_file_name_after("20241231235959999") == "20250101000000000"
    assert index_file_name_after("99999999999999998") == "99999999999999999"  # digits, not a date


def test_golden_bytes(tmp_path):
    with new_file(tmp_path) as f:
        # Java hashCodes (jshell): "TopicA#k1" -1903240649 (negative: keyHash is its abs,
        # slot 9); "TopicA#é😀" 1130974491 (UTF-16 incl. a surrogate pair, slot 27);
        # "polygenelubricants" Integer.MIN_VALUE (abs overflows: keyHash 0, slot 0).
        assert f.put_key("TopicA#k1", 1000, T0)  # beginTimestamp still 0: timeDiff 0
        assert f.put_key("TopicA#é😀", 2000, T0 + 2_500)  # 2.5 s: timeDiff 2
        assert f.put_key("TopicA#k1", 3000, T0 + 61_999)  # same slot: prevIndex 1
        assert f.put_key("polygenelubricants", 4000, T0 - 5_000)  # before begin: 0
        f.flush()
    data = read_bytes(tmp_path / "20240101000000000")
    assert data[:40] == bytes.fromhex(
        "0000018bcfe5687b"  # beginTimestamp  T0 (first entry)
        "0000018bcfe554f3"  # endTimestamp    T0 - 5000 (last entry)
        "00000000000003e8"  # beginPhyOffset  1000
        "0000000000000fa0"  # endPhyOffset    4000
        "00000003"  # hashSlotCount 3 (slots 9, 27, 0)
        "00000005"  # indexCount 5 (entries 1..4 written)
    )
    assert slot_at(data, 9) == bytes.fromhex("00000003")
    assert slot_at(data, 27) == bytes.fromhex("00000002")
    assert slot_at(data, 0) == bytes.fromhex("00000004")
    assert entry_at(data, SLOTS, 0) == bytes(20)  # entry 0 is never written
    assert entry_at(data, SLOTS, 1) == bytes.fromhex("717125c900000000000003e80000000000000000")
    assert entry_at(data, SLOTS, 2) == bytes.fromhex("43694d1b00000000000007d00000000200000000")
    assert entry_at(data, SLOTS, 3) == bytes.fromhex("717125c90000000000000bb80000003d00000001")
    assert entry_at(data, SLOTS, 4) == bytes.fromhex("000000000000000000000fa00000000000000000")
    used = {0, 9, 27}
    assert all(slot_at(data, s) == bytes(4) for s in range(SLOTS) if s not in used)
    assert data[40 + SLOTS * 4 + 5 * 20 :] == bytes(len(data) - (40 + SLOTS * 4 + 5 * 20))


def test_key_hash_edge_cases():
    assert index_key_hash("TopicA#k1") == 1903240649
    assert index_key_hash("polygenelubricants") == index_key_hash("GydZG_") == 0
    assert index_key_hash("") == 0


def test_stored_index_count_zero_reads_as_one(tmp_path):
    # RocketMQ keeps the header in memory until a put or a flush: a file it created
    # and never wrote to has indexCount 0 on disk, and load() takes that as 1.
    path = tmp_path / "20240101000000000"
    new_file(tmp_path).close()
    with open(path, "r+b") as raw:
        raw.seek(36)
        raw.write(bytes(4))
    with IndexFile.open(str(path), hash_slot_num=SLOTS, index_num=ENTRIES) as f:
        assert f.index_count == 1
        assert f.put_key("T#k", 7, T0)
        assert f.index_count == 2
        assert f.select_phy_offsets("T#k", 5) == [7]


def test_rolled_file_inherits_previous_end_and_measures_first_entry_from_it(tmp_path):
    with new_file(tmp_path, prev_end_phy_offset=500, prev_end_timestamp=T0) as f:
        h = f.header
        assert (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset) == (
            T0,
            T0,
            500,
            500,
        )
        assert f.put_key("T#a", 600, T0 + 5_000)
        assert f.put_key("T#b", 700, T0 + 7_000)
        data = read_bytes(f.path)
        # The first entry's timeDiff is taken against the inherited begin (5 s), then
        # beginTimestamp becomes its own time; the next one is measured from there (2 s).
        assert struct.unpack(">iqii", entry_at(data, SLOTS, 1))[2] == 5
        assert struct.unpack(">iqii", entry_at(data, SLOTS, 2))[2] == 2
        assert (f.begin_timestamp, f.begin_phy_offset) == (T0 + 5_000, 600)
        # As in RocketMQ, the first entry then reads back 5 s late.
        assert f.select_phy_offsets("T#a", 5, T0 + 10_000, T0 + 10_000) == [600]


def test_negative_inherited_values_are_ignored(tmp_path):
    with new_file(tmp_path, prev_end_phy_offset=-1, prev_end_timestamp=-5) as f:
        h = f.header
        assert (h.begin_timestamp, h.end_timestamp, h.begin_phy_offset, h.end_phy_offset) == (
            0,
            0,
            0,
            0,
        )


def test_time_diff_clamps(tmp_path):
    with new_file(tmp_path) as f:
        f.put_key("T#0", 1, T0)
        f.put_key("T#1", 2, T0 + (INT_MAX + 10) * 1000)  # beyond an int of seconds
        f.put_key("T#2", 3, T0 - 1)  # earlier than begin
        f.put_key("T#3", 4, LONG_MIN)  # long subtraction wraps around in Java
        data = read_bytes(f.path)
    diffs = [struct.unpack(">iqii", entry_at(data, SLOTS, n))[2] for n in range(1, 5)]
    assert diffs == [0, INT_MAX, 0, INT_MAX]


# --- chains and queries ---------------------------------------------------------------


def test_chain_walk_with_collisions(tmp_path):
    with new_file(tmp_path, slots=1, entries=16) as f:  # one slot: every key collides
        for phy, key in enumerate(["T#A", "T#B", "T#A", "T#C", "T#A"], start=1):
            assert f.put_key(key, phy * 100, T0 + phy * 1000)
        assert f.hash_slot_count == 1
        assert f.select_phy_offsets("T#A", 10) == [500, 300, 100]
        assert f.select_phy_offsets("T#A", 2) == [500, 300]
        assert f.select_phy_offsets("T#B", 10) == [200]
        assert f.select_phy_offsets("T#C", 10) == [400]
        assert f.select_phy_offsets("T#D", 10) == []
        assert f.select_phy_offsets("T#A", 0) == []
        # Different keys, same keyHash: the index cannot tell them apart.
        f.put_key("polygenelubricants", 600, T0 + 6000)
        f.put_key("GydZG_", 700, T0 + 7000)
        assert f.select_phy_offsets("GydZG_", 10) == [700, 600]


def test_time_range_filtering(tmp_path):
    with new_file(tmp_path, slots=4, entries=16) as f:
        for phy, dt in [(1, 0), (2, 1_000), (3, 2_500), (4, 10_000)]:
            f.put_key("T#k", phy, T0 + dt)
        assert f.select_phy_offsets("T#k", 10, T0, T0 + 10_000) == [4, 3, 2, 1]
        # Stored at second resolution: +2.5 s reads as +2 s.
        assert f.select_phy_offsets("T#k", 10, T0 + 2_000, T0 + 2_000) == [3]
        assert f.select_phy_offsets("T#k", 10, T0 + 2_001, T0 + 9_999) == []
        assert f.select_phy_offsets("T#k", 10, T0 + 1_000, T0 + 2_000) == [3, 2]
        assert f.select_phy_offsets("T#k", 10, T0 + 10_001, LONG_MAX) == []
        assert f.is_time_matched(T0 - 5, T0)
        assert f.is_time_matched(T0 - 5, T0 + 20_000)
        assert not f.is_time_matched(T0 + 10_001, T0 + 20_000)


def test_walk_ignores_links_past_index_count(tmp_path):
    # A slot or prevIndex beyond indexCount (a torn write) is not followed.
    with new_file(tmp_path, slots=1, entries=16) as f:
        f.put_key("T#k", 10, T0)
        f.put_key("T#k", 20, T0)
    path = tmp_path / "20240101000000000"
    with open(path, "r+b") as raw:
        raw.seek(40)
        raw.write(struct.pack(">i", 9))
    with IndexFile.open(str(path), hash_slot_num=1, index_num=16) as f:
        assert f.select_phy_offsets("T#k", 10) == []
        # putKey treats that slot as empty: the new entry starts a fresh chain.
        assert f.put_key("T#k", 30, T0)
        assert f.select_phy_offsets("T#k", 10) == [30]
        assert f.hash_slot_count == 2


def test_stale_slot_counts_as_valid_once_index_count_reaches_it(tmp_path):
    # putKey compares a slot with indexCount at the time of that put, not at the
    # start of a batch: a stale 5 is ignored while indexCount is 3 but followed
    # once it is 5, even though entry 5 belongs to another slot.
    expected = None
    for name, batch in (("20240101000000000", False), ("20240101000000001", True)):
        with new_file(tmp_path, name, slots=2, entries=16) as f:
            for phy in (1, 2):
                f.put_hash(1, phy, T0)  # entries 1 and 2, slot 1
            fd = os.open(f.path, os.O_WRONLY)  # slot 0: a stale link to entry 5
            os.pwrite(fd, struct.pack(">i", 5), INDEX_HEADER_SIZE)
            os.close(fd)
            hashes, phys = [1, 1, 0], [3, 4, 5]  # entries 3, 4 (slot 1) and 5 (slot 0)
            if batch:
                f.put_hashes(np.array(hashes, np.int32), np.array(phys), np.full(3, T0))
            else:
                for h, p in zip(hashes, phys, strict=True):
                    f.put_hash(h, p, T0)
            data = read_bytes(f.path)
            assert struct.unpack(">iqii", entry_at(data, 2, 5))[3] == 5
            assert f.hash_slot_count == 1  # slot 1 once; slot 0 looked taken
        if expected is None:
            expected = data
        assert data == expected


def test_full_file(tmp_path):
    with new_file(tmp_path, slots=4, entries=4) as f:
        assert [f.put_key(f"T#{i}", i, T0) for i in range(5)] == [True, True, True, False, False]
        assert f.is_full and f.index_count == 4 and f.entry_count == 3
    with new_file(tmp_path, "20240101000000001", slots=4, entries=4) as f:
        n = f.put_hashes(np.arange(5, dtype=np.int32), np.arange(5), np.full(5, T0))
        assert n == 3 and f.is_full
        assert f.put_hashes(np.arange(2, dtype=np.int32), np.arange(2), np.full(2, T0)) == 0


def test_reopen_reads_back_and_read_only(tmp_path):
    with new_file(tmp_path) as f:
        f.put_key("T#k", 42, T0)
        f.put_key("T#k", 43, T0 + 1000)
        before = f.header
    path = str(tmp_path / "20240101000000000")
    with IndexFile.open(path, hash_slot_num=SLOTS, index_num=ENTRIES, writable=False) as f:
        assert f.header == before
        assert f.select_phy_offsets("T#k", 10) == [43, 42]
        with pytest.raises(RocketSparkError, match="read-only"):
            f.put_key("T#k", 44, T0)
    with pytest.raises(CorruptRecordError, match="expected"):
        IndexFile.open(path, hash_slot_num=SLOTS + 1, index_num=ENTRIES)


def test_open_rejects_impossible_index_count(tmp_path):
    new_file(tmp_path).close()
    path = tmp_path / "20240101000000000"
    with open(path, "r+b") as raw:
        raw.seek(36)
        raw.write(struct.pack(">i", ENTRIES + 1))
    with pytest.raises(CorruptRecordError, match="indexCount"):
        IndexFile.open(str(path), hash_slot_num=SLOTS, index_num=ENTRIES)


# --- batch writes equal one put per key ---------------------------------------------------


@st.composite
def index_states(draw):
    """A file in any state putKey may meet, and a batch of keys to put into it."""
    slots = draw(st.integers(1, 8))
    entries = draw(st.integers(2, 40))
    near = st.integers(T0 - 5_000, T0 + 100_000)
    longs = st.integers(LONG_MIN, LONG_MAX)
    header = (
        draw(st.one_of(st.just(0), near, longs)),  # beginTimestamp
        draw(near),
        draw(longs),
        draw(longs),
        draw(st.integers(INT_MIN, INT_MAX)),  # hashSlotCount
        draw(st.integers(0, entries)),  # indexCount (0: never flushed by RocketMQ)
    )
    slot_values = draw(
        st.lists(
            st.tuples(
                st.integers(0, slots - 1),
                st.one_of(st.integers(-2, entries + 2), st.integers(INT_MIN, INT_MAX)),
            ),
            max_size=8,
        )
    )
    n = draw(st.integers(0, 50))
    hashes = draw(
        st.lists(
            st.one_of(
                st.integers(-9, 9),  # a few slots, hit again and again
                st.integers(INT_MIN, INT_MAX),
                st.sampled_from([INT_MIN, INT_MIN + 1, INT_MAX]),
            ),
            min_size=n,
            max_size=n,
        )
    )
    phys = draw(st.lists(longs, min_size=n, max_size=n))
    stamps = draw(st.lists(st.one_of(near, longs), min_size=n, max_size=n))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    return slots, entries, header, slot_values, hashes, phys, stamps, cuts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index_states())
def test_put_hashes_is_byte_identical_to_put_key(state):
    slots, entries, header, slot_values, hashes, phys, stamps, cuts = state
    with tempfile.TemporaryDirectory() as d:
        one = os.path.join(d, "20240101000000000")
        IndexFile.create(one, hash_slot_num=slots, index_num=entries).close()
        with open(one, "r+b") as raw:
            raw.write(INDEX_HEADER.pack(*header))
            for slot, value in slot_values:
                raw.seek(INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE)
                raw.write(struct.pack(">i", value))
        batch = os.path.join(d, "20240101000000001")
        shutil.copyfile(one, batch)

        with IndexFile.open(one, hash_slot_num=slots, index_num=entries) as f:
            done = [f.put_hash(h, p, t) for h, p, t in zip(hashes, phys, stamps, strict=True)]
        written = 0
        with IndexFile.open(batch, hash_slot_num=slots, index_num=entries) as f:
            for lo, hi in itertools.pairwise([0, *cuts, len(hashes)]):
                written += f.put_hashes(
                    np.array(hashes[lo:hi], dtype=np.int32),
                    np.array(phys[lo:hi], dtype=np.int64),
                    np.array(stamps[lo:hi], dtype=np.int64),
                )
        assert done == [True] * written + [False] * (len(hashes) - written)
        assert read_bytes(batch) == read_bytes(one)


# --- against RocketMQ's own IndexFile -----------------------------------------------------

JAVA_DRIVER = """
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import org.apache.rocketmq.store.index.IndexFile;

/** Runs commands from stdin against org.apache.rocketmq.store.index.IndexFile. */
public class IndexFileDriver {
    public static void main(String[] args) throws Exception {
        int slots = Integer.parseInt(args[0]);
        int entries = Integer.parseInt(args[1]);
        BufferedReader in = new BufferedReader(
            new InputStreamReader(System.in, StandardCharsets.UTF_8));
        IndexFile file = null;
        for (String line; (line = in.readLine()) != null; ) {
            String[] w = line.split(" ");
            if (w[0].equals("create")) {
                file = new IndexFile(w[1], slots, entries, Long.parseLong(w[2]),
                    Long.parseLong(w[3]));
            } else if (w[0].equals("load")) {
                file = new IndexFile(w[1], slots, entries, 0, 0);
                file.load();
            } else if (w[0].equals("put")) {
                System.out.println(file.putKey(key(w[1]), Long.parseLong(w[2]),
                    Long.parseLong(w[3])));
            } else if (w[0].equals("select")) {
                List<Long> out = new ArrayList<>();
                file.selectPhyOffset(out, key(w[1]), Integer.parseInt(w[2]),
                    Long.parseLong(w[3]), Long.parseLong(w[4]));
                System.out.println(out);
            } else if (w[0].equals("close")) {
                file.shutdown();
                file = null;
            }
        }
    }

    static String key(String hex) {
        return new String(HexFormat.of().parseHex(hex), StandardCharsets.UTF_8);
    }
}
"""


@pytest.fixture(scope="module")
def rocketmq(tmp_path_factory):
    """Run command lines through RocketMQ's IndexFile; skip without a JDK and the jars."""
    (classpath,) = need_java()
    build = tmp_path_factory.mktemp("java")
    (build / "IndexFileDriver.java").write_text(JAVA_DRIVER)
    subprocess.run(
        ["javac", "-cp", classpath, "-d", str(build), str(build / "IndexFileDriver.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )

    def run(slots: int, entries: int, commands: list[str]) -> list[str]:
        done = subprocess.run(
            [
                "java",
                *QUIET,
                "-cp",
                f"{classpath}{os.pathsep}{build}",
                "IndexFileDriver",
                str(slots),
                str(entries),
            ],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    return run


def _interop_keys(rng: random.Random) -> list[str]:
    pool = ["TopicA#k1", "TopicA#ключ", "TopicA#é😀", "polygenelubricants", "GydZG_", "T#", "T# x"]
    pool += [f"T#{rng.randrange(10**9)}" for _ in range(12)]
    return pool


def _interop_puts(rng: random.Random, keys: list[str], n: int, phy0: int, ts0: int):
    puts = []
    for i in range(n):
        ts = ts0 + rng.choice(
            [rng.randrange(0, 90_000), -rng.randrange(1, 5_000), (INT_MAX + 7) * 1000]
        )
        puts.append((rng.choice(keys), phy0 + i * 97, ts))
    return puts


def test_rocketmq_writes_what_we_write(tmp_path, rocketmq):
    rng = random.Random(2024)
    keys = _interop_keys(rng)
    slots, entries = 8, 48
    first = _interop_puts(rng, keys, 50, 0, T0)  # overflows the file: the last puts fail
    second = _interop_puts(rng, keys, 30, 10_000, T0 + 100_000)
    prev_phy, prev_ts = first[entries - 2][1], first[entries - 2][2]
    java_dir = tmp_path / "java"
    java_dir.mkdir()
    commands = [f"create {java_dir}/20240101000000000 0 0"]
    commands += [f"put {k.encode().hex()} {p} {t}" for k, p, t in first]
    commands += ["close", f"create {java_dir}/20240101000000001 {prev_phy} {prev_ts}"]
    commands += [f"put {k.encode().hex()} {p} {t}" for k, p, t in second]
    commands += ["close"]
    java_ok = [line == "true" for line in rocketmq(slots, entries, commands)]

    ours_ok = []
    with new_file(tmp_path, "20240101000000000", slots=slots, entries=entries) as f:
        ours_ok += [f.put_key(k, p, t) for k, p, t in first]
        assert (f.end_phy_offset, f.end_timestamp) == (prev_phy, prev_ts)
    with new_file(
        tmp_path,
        "20240101000000001",
        slots=slots,
        entries=entries,
        prev_end_phy_offset=prev_phy,
        prev_end_timestamp=prev_ts,
    ) as f:
        ours_ok += [f.put_key(k, p, t) for k, p, t in second]
    assert ours_ok == java_ok and java_ok.count(False) == 3
    for name in ("20240101000000000", "20240101000000001"):
        assert read_bytes(tmp_path / name) == read_bytes(java_dir / name), name


def test_rocketmq_reads_what_we_write(tmp_path, rocketmq):
    rng = random.Random(99)
    keys = _interop_keys(rng)
    slots, entries = 8, 64
    puts = _interop_puts(rng, keys, 60, 5_000, T0)
    with new_file(
        tmp_path,
        slots=slots,
        entries=entries,
        prev_end_phy_offset=4_000,
        prev_end_timestamp=T0 - 3_000,
    ) as f:
        f.put_hashes(
            java_hash_many([k for k, _, _ in puts]),
            np.array([p for _, p, _ in puts]),
            np.array([t for _, _, t in puts]),
        )
        ranges = [
            (0, LONG_MAX),
            (T0, T0 + 30_000),
            (T0 + 30_000, T0 + 60_000),
            (T0 + 90_000, LONG_MAX),
        ]
        queries = [(k, m, b, e) for k in keys for m in (3, 64) for b, e in ranges]
        ours = [f.select_phy_offsets(k, m, b, e) for k, m, b, e in queries]
    commands = [f"load {tmp_path}/20240101000000000"]
    commands += [f"select {k.encode().hex()} {m} {b} {e}" for k, m, b, e in queries]
    theirs = rocketmq(slots, entries, commands)
    assert [json.loads(line) for line in theirs] == ours
    assert any(len(r) > 1 for r in ours)
