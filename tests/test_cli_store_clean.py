"""`rocketspark store clean`, run as the command it is."""

from __future__ import annotations

import os
import subprocess
import sys

from rocketspark.store import Message, MessageStore

SMALL = {"mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 160}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocketspark.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_store_clean_deletes_old_segments_only(tmp_path):
    path = str(tmp_path / "s")
    with MessageStore.open(path, **SMALL) as s:
        s.create_topic("orders", queues=1)
        for _ in range(60):
            s.put(Message("orders", os.urandom(200)))
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog=4096\nmappedFileSizeConsumeQueue=160\n")
    segs = sorted(os.listdir(os.path.join(path, "commitlog")))
    out = _cli("--config", str(conf), "store", "clean", path, "--reserved-hours", "1")
    assert out.returncode == 0, out.stderr
    assert "deleted 0 CommitLog segment(s)" in out.stdout
    for name in segs[:3]:
        f = os.path.join(path, "commitlog", name)
        os.utime(f, (os.stat(f).st_mtime - 7200,) * 2)
    out = _cli("--config", str(conf), "store", "clean", path, "--reserved-hours", "1")
    assert out.returncode == 0, out.stderr
    assert "deleted 3 CommitLog segment(s) older than 1 h" in out.stdout
    assert sorted(os.listdir(os.path.join(path, "commitlog"))) == segs[3:]
    with MessageStore.open(path, **SMALL) as s:
        assert s.min_offset("orders", 0) > 0 and s.max_offset("orders", 0) == 60
