"""IndexService: the index files of one store, rolled, queried, truncated, shared by processes."""

from __future__ import annotations

import glob
import itertools
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

import rocketspark
from rocketspark.errors import ConfigError, RocketSparkError
from rocketspark.store.index_file import index_file_name
from rocketspark.store.index_service import IndexService

SLOTS, ENTRIES = 64, 256
T0 = 1_700_000_000_123
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(rocketspark.__file__)))


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def service(path, slots=SLOTS, entries=ENTRIES, **kw):
    return IndexService(str(path), hash_slot_num=slots, index_num=entries, **kw)


def test_dimensions_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="maxIndexNum"):
        IndexService(str(tmp_path), hash_slot_num=4, index_num=1)
    with pytest.raises(ConfigError, match="maxHashSlotNum"):
        IndexService(str(tmp_path), hash_slot_num=0, index_num=4)
    with pytest.raises(ConfigError, match="more than"):
        IndexService(str(tmp_path), hash_slot_num=4, index_num=2**27)


def test_build_index_keys_and_query(tmp_path):
    with service(tmp_path / "index") as idx:
        assert idx.max_phy_offset == -1
        assert idx.build_index("T", 100, T0, "U1", "k1  k2") == 3  # empty token skipped
        assert idx.build_index("T", 200, T0 + 1000, None, ("k1",)) == 1
        assert idx.build_index("T", 300, T0 + 2000, "", None) == 1  # RocketMQ indexes "T#"
        assert idx.build_index("T2", 400, T0 + 3000, None, "") == 0
        assert idx.max_phy_offset == 300
        assert idx.query("T", "k1") == [200, 100]
        assert idx.query("T", "k2") == [100]
        assert idx.query("T", "U1") == [100]
        assert idx.query("T", "") == [300]
        assert idx.query("T2", "k1") == []
        assert idx.query("T", "k1", max_num=1) == [200]
        assert idx.query("T", "k1", begin_ms=T0 + 500) == [200]
        assert idx.query("T", "k1", end_ms=T0 + 500) == [100]


def test_query_drops_duplicates(tmp_path):
    with service(tmp_path / "index") as idx:
        idx.build_index("T", 100, T0, "same", ["same", "same"])
        assert idx.query("T", "same") == [100]


def test_rolling_to_new_files(tmp_path):
    with service(tmp_path / "index", slots=4, entries=4) as idx:  # 3 entries per file
        for i in range(5):
            idx.build_index("T", 1000 + i, T0 + i * 1000, f"U{i}", [f"k{i % 2}"])
        files = idx.files
        assert [f.entry_count for f in files] == [3, 3, 3, 1]
        names = [f.name for f in files]
        assert names == sorted(set(names)) and all(len(n) == 17 and n.isdigit() for n in names)
        assert sorted(os.listdir(tmp_path / "index")) == names
        for prev, f in itertools.pairwise(files):
            assert f.begin_phy_offset >= prev.end_phy_offset
        assert idx.max_phy_offset == 1004
        assert idx.query("T", "k0") == [1004, 1002, 1000]
        assert idx.query("T", "k1") == [1003, 1001]
        assert idx.query("T", "U2") == [1002]


def test_batch_equals_one_record_at_a_time(tmp_path):
    rng = random.Random(7)
    records = [
        (
            rng.choice(["A", "B"]),
            100 * i,
            T0 + 250 * i,
            rng.choice([None, f"U{i}", ""]),
            rng.choice(["", "x", "x y", ("z", "é"), ()]),
        )
        for i in range(1, 60)
    ]
    with service(tmp_path / "one", slots=3, entries=7) as one:
        for topic, phy, ts, uniq, keys in records:
            one.build_index(topic, phy, ts, uniq, keys)
        one_bytes = [read_bytes(f.path) for f in one.files]
    with service(tmp_path / "batch", slots=3, entries=7) as batch:
        topics, phys, stamps, uniqs, keys = zip(*records, strict=True)
        batch.build_index_batch(topics[:20], uniqs[:20], keys[:20], phys[:20], stamps[:20])
        batch.build_index_batch(
            list(topics[20:]),
            list(uniqs[20:]),
            list(keys[20:]),
            np.array(phys[20:]),
            np.array(stamps[20:]),
        )
        assert [read_bytes(f.path) for f in batch.files] == one_bytes
    with service(tmp_path / "one-topic") as idx:
        assert idx.build_index_batch("T", ["u1", "u2"], [(), "a"], [1, 2], [T0, T0]) == 3
        assert idx.query("T", "a") == [2]
        with pytest.raises(ValueError):
            idx.build_index_batch(["T"], ["u1", "u2"], [(), ()], [3, 4], [T0, T0])


def test_redispatch_is_idempotent(tmp_path):
    with service(tmp_path / "index", slots=4, entries=5) as idx:
        args = (["T"] * 4, ["a", "b", "c", "d"], [("k",)] * 4, [10, 20, 30, 40], [T0] * 4)
        assert idx.build_index_batch(*args) == 8
        before = [read_bytes(f.path) for f in idx.files]
        assert idx.build_index_batch(*args) == 0
        assert idx.build_index("T", 40, T0, "d", "k") == 0
        assert [read_bytes(f.path) for f in idx.files] == before
        # A batch that overlaps what is indexed writes only the new records.
        assert idx.build_index_batch(["T", "T"], ["d", "e"], [(), ()], [40, 50], [T0, T0]) == 1
        assert idx.query("T", "e") == [50] and idx.query("T", "d") == [40]


def test_truncate(tmp_path):
    def build():
        idx = service(tmp_path / "index", slots=4, entries=4)
        for phy in (100, 200, 300, 400, 500, 600, 700, 800, 900):
            idx.build_index("T", phy, T0 + phy, None, ["k"])
        assert [(f.begin_phy_offset, f.end_phy_offset) for f in idx.files] == [
            (100, 300),
            (400, 600),
            (700, 900),
        ]
        return idx

    with build() as idx:
        assert idx.truncate(1000) is None
        assert len(idx.files) == 3
        assert idx.truncate(500) == 400  # (400, 600) reaches 500; (700, 900) lies past it
        assert [(f.begin_phy_offset, f.end_phy_offset) for f in idx.files] == [(100, 300)]
        assert len(os.listdir(tmp_path / "index")) == 1
        assert idx.max_phy_offset == 300
        # The caller re-dispatches from 400; records up to 300 are skipped.
        for phy in (100, 200, 300, 400):
            idx.build_index("T", phy, T0 + phy, None, ["k"])
        assert idx.query("T", "k") == [400, 300, 200, 100]
    shutil.rmtree(tmp_path / "index")
    with build() as idx:
        assert idx.truncate(700) is None  # a file starting at 700 goes, nothing to rebuild
        assert [f.end_phy_offset for f in idx.files] == [300, 600]
        assert idx.truncate(0) is None
        assert idx.files == () and idx.max_phy_offset == -1


def test_truncate_removes_empty_rolled_file_and_temporaries(tmp_path):
    with service(tmp_path / "index", slots=4, entries=4) as idx:
        idx.build_index("T", 50, T0, "a", ())
        idx.build_index("T", 100, T0, "b", "c")  # fills the first file exactly
        idx._new_file()  # an empty successor inheriting begin = end = 100
        open(tmp_path / "index" / ".20240101000000000.123.tmp", "wb").close()
        assert idx.truncate(100) == 50
        assert idx.files == () and os.listdir(tmp_path / "index") == []


def test_unique_names_within_one_millisecond(tmp_path, monkeypatch):
    monkeypatch.setattr("time.time_ns", lambda: T0 * 1_000_000)
    with service(tmp_path / "index", slots=1, entries=2) as idx:
        for phy in range(1, 5):
            idx.build_index("T", phy, T0, None, "k")
        names = [f.name for f in idx.files]
        first = index_file_name(T0)
        assert names[0] == first and len(set(names)) == 4 and names == sorted(names)
        assert idx.query("T", "k") == [4, 3, 2, 1]


def test_second_service_sees_entries_after_refresh(tmp_path):
    with (
        service(tmp_path / "index", slots=4, entries=4) as writer,
        service(tmp_path / "index", slots=4, entries=4, writable=False) as reader,
    ):
        writer.build_index("T", 100, T0, "u1", ())
        assert reader.query("T", "u1") == []  # the file is new to the reader
        reader.refresh()
        assert reader.query("T", "u1") == [100]
        writer.build_index("T", 200, T0 + 1, "u2", ())  # same file: visible at once
        assert reader.query("T", "u2") == [200]
        writer.build_index("T", 300, T0 + 2, "u3", "k")  # rolls to a second file
        reader.refresh()
        assert reader.query("T", "k") == [300] and len(reader.files) == 2
        assert reader.max_phy_offset == 300
        with pytest.raises(RocketSparkError, match="read-only"):
            reader.build_index("T", 400, T0, "u4", ())
        assert writer.truncate(300) == 100  # both files reach 300
        reader.refresh()
        assert reader.files == () and reader.query("T", "u1") == []


def test_reader_in_another_process(tmp_path):
    index_dir = tmp_path / "index"
    with service(index_dir, slots=4, entries=4) as idx:
        for i in range(10):
            idx.build_index("T", 100 * i, T0 + i, f"u{i}", "k")
        idx.flush()
        expected = {k: idx.query("T", k) for k in ("k", "u3", "u9", "none")}
        script = (
            "import json, sys\n"
            "from rocketspark.store.index_service import IndexService\n"
            f"idx = IndexService({str(index_dir)!r}, hash_slot_num=4, index_num=4,"
            " writable=False)\n"
            "print(json.dumps({k: idx.query('T', k) for k in ('k', 'u3', 'u9', 'none')}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    assert json.loads(out) == expected
    assert expected["k"] == [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]


def test_reopen_service(tmp_path):
    with service(tmp_path / "index", slots=4, entries=4) as idx:
        for i in range(7):
            idx.build_index("T", i + 1, T0 + i, None, "k")
        idx.flush()
        names = [f.name for f in idx.files]
    with service(tmp_path / "index", slots=4, entries=4) as idx:
        assert [f.name for f in idx.files] == names
        assert idx.query("T", "k") == [7, 6, 5, 4, 3, 2, 1]
        assert idx.max_phy_offset == 7
        idx.build_index("T", 8, T0 + 8, None, "k")
        assert idx.query("T", "k", max_num=2) == [8, 7]


# --- a store written by RocketMQ 5.3.1 (see data/rocketmq-5-store/README.md) -------------

GOLDEN_STORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rocketmq-5-store")


@pytest.fixture(scope="module")
def golden():
    path = os.path.join(GOLDEN_STORE, "expected.json")
    if not os.path.exists(path):
        pytest.skip("the golden RocketMQ store is not present")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def golden_dims(golden) -> dict[str, int]:
    cfg = golden["config"]
    return {"hash_slot_num": cfg["maxHashSlotNum"], "index_num": cfg["maxIndexNum"]}


def test_golden_store_answers_rocketmq_queries(golden):
    index_dir = os.path.join(GOLDEN_STORE, "index")
    with IndexService(index_dir, writable=False, **golden_dims(golden)) as idx:
        (f,) = idx.files
        assert (f.entry_count, f.hash_slot_count) == (114, 49)  # as its README says
        assert len(golden["indexQueries"]) == 114
        for q in golden["indexQueries"]:
            assert idx.query(q["topic"], q["key"], 32) == q["commitLogOffsets"], q


def test_golden_store_index_rebuilt_byte_for_byte(golden, tmp_path):
    messages = sorted(golden["messages"], key=lambda m: m["commitLogOffset"])
    with IndexService(str(tmp_path / "index"), **golden_dims(golden)) as idx:
        idx.build_index_batch(
            [m["topic"] for m in messages],
            [m["properties"].get("UNIQ_KEY") for m in messages],
            [m["properties"].get("KEYS") for m in messages],
            [m["commitLogOffset"] for m in messages],
            [m["storeTimestamp"] for m in messages],
        )
        (ours,) = idx.files
        (theirs,) = glob.glob(os.path.join(GOLDEN_STORE, "index", "*"))
        assert read_bytes(ours.path) == read_bytes(theirs)
