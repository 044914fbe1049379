"""The read-only store verifier: a good store passes, damage is named, nothing is written."""

from __future__ import annotations

import os

import pytest

from rocketspark.errors import ConfigError
from rocketspark.store import MessageStore
from tests.store.helpers.stores import filled_store


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
