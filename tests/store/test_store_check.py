"""The read-only store verifier: a good store passes, damage is named, nothing is written."""

from __future__ import annotations

import os

import pytest

from rocketspark.errors import ConfigError
from rocketspark.store import MessageStore
from tests.store.helpers.stores import SMALL, filled_store


def test_store_check_checks_a_store_whose_index_dimensions_its_files_do_not_tell(tmp_path):
    """No record, index files of neither the defaults nor four entries a slot (a
    broker's custom settings): open needs them given, but check still checks the
    CommitLog and ConsumeQueues, and the index files against each other."""
    from rocketspark.store.store_check import check_store

    root = str(tmp_path / "s")
    filled_store(
        root,
        mappedFileSizeCommitLog=65536,
        mappedFileSizeConsumeQueue=400,
        maxHashSlotNum=10,
        maxIndexNum=30,
    )
    os.unlink(os.path.join(root, "rocketspark.geometry"))
    with pytest.raises(ConfigError, match="maxHashSlotNum and maxIndexNum"):
        MessageStore.open(root)
    report = check_store(root)
    assert report.ok and report.queues == 2, report.problems
    assert any("index files checked only" in n for n in report.notes), report.notes
    index = sorted(os.listdir(os.path.join(root, "index")))
    assert len(index) > 1
    os.truncate(os.path.join(root, "index", index[0]), 100)
    assert any("100 bytes" in p for p in check_store(root).problems)


def _stamps(root) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, f.read())
    return out


def test_a_good_store_checks_out_and_the_check_writes_nothing(tmp_path):
    from rocketspark.store.store_check import check_store

    root = str(tmp_path / "s")
    filled_store(root, n=40, **SMALL)
    before = _stamps(root)
    report = check_store(root)
    assert report.ok and report.problems == [], report.problems
    assert report.records == 40 and report.queues == 2 and report.queue_entries == 40
    assert report.segments == len(os.listdir(os.path.join(root, "commitlog"))) > 1
    assert report.bytes_used > 40 * 300
    assert report.render().endswith("OK: every record and ConsumeQueue entry checks out")
    assert _stamps(root) == before


def test_a_damaged_body_is_a_problem_naming_file_and_offset_and_nothing_is_written(tmp_path):
    from rocketspark.store.store_check import check_store

    root = str(tmp_path / "s")
    filled_store(root, n=40, **SMALL)
    with MessageStore.open(root) as s:
        (m,) = s.pull("orders", 0, 0, max_msgs=1).messages
    seg = os.path.join(root, "commitlog", f"{0:020d}")
    at = m.commitlog_offset + m.store_size - 60  # inside the body (300 zero bytes + name)
    with open(seg, "r+b") as f:
        f.seek(at)
        f.write(b"\xff")
    before = _stamps(root)
    report = check_store(root)
    assert not report.ok and len(report.problems) == 1, report.problems
    problem = report.problems[0]
    assert f"offset {m.commitlog_offset} (file {os.path.basename(seg)})" in problem
    assert "body CRC mismatch" in problem
    assert "PROBLEMS" in report.render()
    assert _stamps(root) == before


@pytest.mark.parametrize("case", ["absent", "empty", "foreign"])
def test_a_directory_that_is_no_store_is_one_problem(tmp_path, case):
    from rocketspark.store.store_check import check_store

    path = tmp_path / "p"
    if case != "absent":
        path.mkdir()
    if case == "foreign":
        (path / "notes.txt").write_text("mine")
    report = check_store(str(path))
    assert len(report.problems) == 1 and report.records == 0
    assert {"absent": "not there", "empty": "an empty directory", "foreign": "not a store"}[
        case
    ] in report.problems[0]
    assert os.path.exists(path) == (case != "absent")
