"""What is a store directory, its recorded geometry, and the sizes its files must have."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketspark.errors import ConfigError
from rocketspark.store import Message, MessageStore
from tests.store.helpers.stores import SMALL, filled_store

GEOMETRY_KEYS = (
    "mappedFileSizeCommitLog",
    "mappedFileSizeConsumeQueue",
    "maxHashSlotNum",
    "maxIndexNum",
)


GEOMETRY_FIELDS = (
    "mapped_file_size_commit_log",
    "mapped_file_size_consume_queue",
    "max_hash_slot_num",
    "max_index_num",
)


def _file_stamps(root) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under ``root``, by relative path."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(d, n))
            out[os.path.relpath(os.path.join(d, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    made=st.tuples(
        st.sampled_from([4096, 8192]),
        st.sampled_from([20 * 16, 20 * 40]),
        st.sampled_from([64, 32]),
        st.sampled_from([256, 512]),
    ),
    asking=st.tuples(
        st.sampled_from([None, 4096, 8192, 12000]),
        st.sampled_from([None, 20 * 16, 20 * 40, 12000]),
        st.sampled_from([None, 32, 64, 100]),
        st.sampled_from([None, 256, 512, 300]),
    ),
)
def test_an_open_either_refuses_a_geometry_override_untouched_or_uses_the_stores(made, asking):
    """Whatever a store was made with and whatever an open asks for: an override that
    differs from the store's geometry is refused before any file changes; otherwise
    the store's own geometry is used and its files keep their sizes."""
    made_kw = dict(zip(GEOMETRY_KEYS, made, strict=True))
    asked = {k: v for k, v in zip(GEOMETRY_KEYS, asking, strict=True) if v is not None}
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "s")
        filled_store(root, **made_kw)
        before = _file_stamps(root)
        conflict = any(made_kw[k] != v for k, v in asked.items())
        try:
            s = MessageStore.open(root, **asked)
        except ConfigError as exc:
            assert conflict, exc
            assert _file_stamps(root) == before
            key = next(k for k, v in asked.items() if made_kw[k] != v)
            assert key in str(exc) and str(made_kw[key]) in str(exc)
            return
        with s:
            assert not conflict
            assert tuple(getattr(s.config, f) for f in GEOMETRY_FIELDS) == made
            got = [m.body[:4] for q in (0, 1) for m in s.pull("orders", q, 0, 64).messages]
            assert sorted(got) == [b"m%03d" % i for i in range(40)]
            assert len(s.query_by_key("orders", "k7")) == 1
        after = _file_stamps(root)
        for path, (size, _) in before.items():
            if path.startswith(("commitlog", "consumequeue", "index")):
                assert after[path][0] == size, path


def test_a_store_opened_with_default_settings_keeps_the_geometry_it_was_made_with(tmp_path):
    root = str(tmp_path / "s")
    filled_store(root, **SMALL)
    sizes = {p: v[0] for p, v in _file_stamps(root).items()}
    with MessageStore.open(root) as s:  # no overrides: the store's geometry, not 1 GiB
        assert s.config.mapped_file_size_commit_log == 4096
        assert s.config.max_index_num == 256
        s.put(Message("orders", b"more"))
        assert s.max_offset("orders", 0) + s.max_offset("orders", 1) == 41
    for path, v in _file_stamps(root).items():
        if path in sizes and path.startswith(("commitlog", "consumequeue", "index")):
            assert v[0] == sizes[path], path
    with open(os.path.join(root, "rocketspark.geometry"), encoding="ascii") as f:
        assert "mappedFileSizeCommitLog=4096" in f.read()


def test_a_config_built_directly_counts_its_non_default_geometry_as_asked_for(tmp_path):
    from rocketspark.store import MessageStoreConfig

    root = str(tmp_path / "s")
    filled_store(root, **SMALL)
    with pytest.raises(ConfigError, match="mappedFileSizeCommitLog=8192"):
        MessageStore(MessageStoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=8192))
    with MessageStore(MessageStoreConfig(store_path_root_dir=root)) as s:
        assert s.config.mapped_file_size_commit_log == 4096


def test_a_broker_conf_geometry_is_for_new_stores_only(tmp_path):
    """broker.conf sizes make new stores; an existing store keeps its own (as a store
    written by a broker with other settings opens with the defaults)."""
    root = str(tmp_path / "s")
    filled_store(root, **SMALL)
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=2000\n")
    with MessageStore.open(root, config_file=str(conf)) as s:
        assert s.config.mapped_file_size_commit_log == 4096
        assert s.config.mapped_file_size_consume_queue == 20 * 16
    with MessageStore.open(str(tmp_path / "new"), config_file=str(conf)) as s:
        assert s.config.mapped_file_size_commit_log == 65536


@pytest.mark.parametrize(
    "where, size",
    [
        ("commitlog/00000000000000004096", 600),
        ("commitlog/00000000000000004096", 0),
        ("commitlog/00000000000000000000", 600),
        ("commitlog/00000000000000000000", 0),
        ("consumequeue/orders/0/00000000000000000000", 100),
        ("consumequeue/orders/1/00000000000000000320", 0),
        ("index", 1000),
    ],
)
def test_a_short_file_is_damage_reported_by_open_and_check_never_padded(tmp_path, where, size):
    from rocketspark.errors import SegmentSizeError
    from rocketspark.store.store_check import check_store

    root = str(tmp_path / "s")
    filled_store(root, **SMALL)
    if where == "index":
        where = os.path.join("index", sorted(os.listdir(os.path.join(root, "index")))[0])
    path = os.path.join(root, where)
    full = os.path.getsize(path)
    os.truncate(path, size)
    with pytest.raises(SegmentSizeError) as info:
        MessageStore.open(root)
    assert info.value.file == path and (info.value.expected, info.value.actual) == (full, size)
    assert path in str(info.value) and f"{size} bytes, expected {full}" in str(info.value)
    with pytest.raises(SegmentSizeError):
        MessageStore.open(root, **SMALL)
    assert os.path.getsize(path) == size  # never padded
    report = check_store(root)
    assert not report.ok and any(path in p and f"{size} bytes" in p for p in report.problems)


def test_a_lone_short_segment_of_a_store_without_a_record_is_damage(tmp_path):
    """A store written before the geometry was recorded (or by a broker): a lone
    segment that cannot be a whole one, or that ends before the data does, is damage."""
    from rocketspark.errors import SegmentSizeError
    from rocketspark.store.store_check import check_store

    root = str(tmp_path / "s")
    with MessageStore.open(root, mappedFileSizeCommitLog=65536) as s:
        s.create_topic("orders", queues=1)
        s.put_batch([Message("orders", bytes(200)) for _ in range(100)])
    os.unlink(os.path.join(root, "rocketspark.geometry"))
    seg = os.path.join(root, "commitlog", "0" * 20)
    for size in (600, 8192):
        os.truncate(seg, size)
        with pytest.raises(SegmentSizeError, match="truncated"):
            MessageStore.open(root)
        assert os.path.getsize(seg) == size
        assert not check_store(root).ok


def test_a_first_open_lists_each_queue_directory_once(tmp_path, monkeypatch):
    """The size check and the removal of killed writers' leftovers share one listing:
    a store of many queues opens in time proportional to its files, once."""
    from collections import Counter

    root = str(tmp_path / "s")
    with MessageStore.open(root, **SMALL) as s:
        for t in range(3):
            s.create_topic(f"t{t}", queues=4)
            s.put_batch([Message(f"t{t}", b"x", queue_id=q) for q in range(4) for _ in range(20)])
    listed: Counter[str] = Counter()
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path="."):
        listed[os.path.abspath(path)] += 1
        return real_listdir(path)

    def scandir(path="."):
        listed[os.path.abspath(path)] += 1
        return real_scandir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    with MessageStore.open(root):
        pass
    queue_dirs = {
        p: n
        for p, n in listed.items()
        if os.sep + "consumequeue" + os.sep in p and os.path.basename(p).isdigit()
    }
    assert len(queue_dirs) == 12 and set(queue_dirs.values()) == {1}, queue_dirs


def test_only_an_absent_or_empty_directory_becomes_a_new_store(tmp_path):
    from rocketspark.errors import StorePathError

    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(StorePathError, match="not a store.*notes.txt"):
        MessageStore.open(other)
    assert os.listdir(other) == ["notes.txt"]  # nothing written
    with MessageStore.open(other, create=True) as s:  # unless asked explicitly
        s.create_topic("t", queues=1)
    with MessageStore.open(other) as s:  # a store now
        assert s.has_topic("t")
    empty = tmp_path / "empty"
    empty.mkdir()
    with MessageStore.open(empty):
        pass
    with pytest.raises(StorePathError, match="no store"):
        MessageStore.open(tmp_path / "absent", create=False)
    assert not os.path.exists(tmp_path / "absent")
    cut_short = tmp_path / "cut"  # a store whose first open died early is still one
    cut_short.mkdir()
    (cut_short / "lock").write_bytes(b"")
    (cut_short / "config").mkdir()
    with MessageStore.open(cut_short, create=False):
        pass
    app = tmp_path / "app"  # store names alone, without the lock file, are not a store
    (app / "config").mkdir(parents=True)
    with pytest.raises(StorePathError, match="not a store"):
        MessageStore.open(app)
    acl = tmp_path / "acl"  # a config/ of RocketMQ's config files alone: a store-to-be
    (acl / "config").mkdir(parents=True)
    (acl / "config" / "plain_acl.yml").write_text("accounts: []\n")
    with MessageStore.open(acl) as s:
        s.create_topic("T", queues=1)
    assert (acl / "config" / "plain_acl.yml").read_text() == "accounts: []\n"
    from rocketspark.store.layout import directory_kind

    assert directory_kind(str(acl)) == "store"


@pytest.mark.parametrize("case", ["file", "under a file", "nul"])
def test_a_store_path_that_cannot_be_a_store_is_a_store_path_error(tmp_path, case):
    from rocketspark.errors import RocketSparkError, StorePathError

    afile = tmp_path / "a-file"
    afile.write_text("")
    path = {"file": str(afile), "under a file": str(afile / "s"), "nul": str(tmp_path / "a\x00b")}[
        case
    ]
    with pytest.raises(StorePathError) as info:
        MessageStore.open(path)
    assert isinstance(info.value, RocketSparkError) and info.value.path == path
    assert (path if case != "nul" else "NUL") in str(info.value)
    assert afile.read_text() == ""


def test_a_store_this_user_cannot_write_is_a_store_path_error(tmp_path):
    """(Run as another user when the tests run as root, where permissions do not bite.)"""
    import subprocess
    import sys

    root = tempfile.mkdtemp()
    try:
        with MessageStore.open(os.path.join(root, "s")) as s:
            s.create_topic("t", queues=1)
        os.chmod(root, 0o755)
        code = (
            "import sys\nfrom rocketspark.store import MessageStore\n"
            "from rocketspark.errors import StorePathError\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n        MessageStore.open(p)\n"
            "    except StorePathError as e:\n        print('refused', p, e)\n"
        )
        kw: dict = {}
        if os.getuid() == 0:
            kw = dict(user=65534, group=65534)
        else:
            os.chmod(os.path.join(root, "s"), 0o555)
        try:
            r = subprocess.run(
                [sys.executable, "-c", code, os.path.join(root, "s"), os.path.join(root, "new")],
                capture_output=True,
                text=True,
                timeout=120,
                env=dict(os.environ, PYTHONPATH=os.getcwd()),
                cwd=os.getcwd(),
                **kw,
            )
        except PermissionError:
            pytest.skip("this Python cannot be run as another user")
        if (
            kw
            and r.returncode
            and "Permission denied" in r.stderr
            and "rocketspark" not in r.stderr
        ):
            pytest.skip("this Python cannot be run as another user")
        lines = r.stdout.splitlines()
        assert len(lines) == 2, r.stdout + r.stderr
        assert "not writable" in lines[0] and "not writable" in lines[1]
        assert "Traceback" not in r.stderr
    finally:
        os.chmod(os.path.join(root, "s"), 0o755)
        shutil.rmtree(root)


def test_a_first_open_killed_while_recording_the_geometry_leaves_a_store(tmp_path):
    """SIGKILL between the lock file and the geometry record leaves the lock file and
    the record's hidden temporary file: still a store whose first open was cut short."""
    import signal
    import subprocess
    import sys

    root = str(tmp_path / "s")
    code = (
        "import os, sys, time\nfrom rocketspark.store import MessageStore\n"
        "def stuck(*a):\n    print('recording', flush=True)\n    time.sleep(120)\n"
        "os.link = stuck\nMessageStore.open(sys.argv[1])\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, root],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    try:
        assert p.stdout.readline().strip() == "recording"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    left = sorted(os.listdir(root))
    assert "lock" in left and any(n.endswith(".tmp") for n in left), left
    with MessageStore.open(root, create=False) as s:
        s.create_topic("t", queues=1)
    assert not any(n.endswith(".tmp") for n in os.listdir(root))


def test_a_store_name_of_the_wrong_type_makes_no_store(tmp_path):
    """A file called commitlog among an application's files is not a store: nothing
    is written there (a directory called rocketspark.state neither)."""
    from rocketspark.errors import StorePathError
    from rocketspark.store.store_check import check_store

    for name, make in (
        ("commitlog", lambda p: p.write_text("notes")),
        ("rocketspark.state", lambda p: p.mkdir()),
    ):
        app = tmp_path / name
        app.mkdir()
        make(app / name)
        (app / "main.py").write_text("print(1)")
        with pytest.raises(StorePathError, match="not a store.*main.py"):
            MessageStore.open(app)
        assert sorted(os.listdir(app)) == sorted([name, "main.py"])
        assert not check_store(str(app)).ok


def test_a_dangling_symbolic_link_is_a_store_path_error(tmp_path):
    from rocketspark.errors import StorePathError

    link = tmp_path / "s"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(StorePathError, match="symbolic link") as info:
        MessageStore.open(link)
    assert info.value.path == str(link)
    under = tmp_path / "d"
    under.symlink_to(tmp_path / "gone")
    with pytest.raises(StorePathError, match="cannot create store directory") as info:
        MessageStore.open(under / "s")
    assert info.value.path == str(under / "s")
    assert not os.path.lexists(tmp_path / "gone")


def test_an_absent_store_read_under_an_unwritable_directory_is_no_store(tmp_path):
    """Only making a store needs a writable parent: a reader of a mistyped path is told
    there is no store there, not that a directory cannot be made."""
    from rocketspark.errors import StorePathError
    from rocketspark.store.store_check import check_store

    parent = "/proc/sys"  # not writable, even by root
    if not os.path.isdir(parent) or os.access(parent, os.W_OK):
        pytest.skip("needs a directory this process cannot write")
    path = os.path.join(parent, "rocketspark-absent", "store")
    with pytest.raises(StorePathError, match="no store at"):
        MessageStore.open(path, create=False)
    problems = check_store(path).problems
    assert problems and "cannot create" not in problems[0] and "not a store" in problems[0]
    with pytest.raises(StorePathError, match="cannot create store directory.*not writable"):
        MessageStore.open(path)


# --- the module's own functions, without opening a store ------------------------------


def test_directory_kind_tells_absent_empty_store_and_foreign(tmp_path):
    from rocketspark.store.layout import directory_kind

    assert directory_kind(str(tmp_path / "absent")) == "absent"
    (tmp_path / "empty").mkdir()
    assert directory_kind(str(tmp_path / "empty")) == "empty"
    for marker in ("commitlog", "consumequeue"):
        (tmp_path / marker / marker).mkdir(parents=True)
        assert directory_kind(str(tmp_path / marker)) == "store"
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "lock").write_bytes(b"")
    (cut / "config").mkdir()
    assert directory_kind(str(cut)) == "store"
    (cut / "notes.txt").write_text("mine")
    assert directory_kind(str(cut)) == "foreign"
    acl = tmp_path / "acl"  # prepared for serve: the ACL file written before the store
    (acl / "config").mkdir(parents=True)
    (acl / "config" / "plain_acl.yml").write_text("accounts: []\n")
    assert directory_kind(str(acl)) == "empty"
    (acl / "config" / "app.properties").write_text("mine")
    assert directory_kind(str(acl)) == "foreign"
    filled_store(str(tmp_path / "s"), n=3, **SMALL)
    assert directory_kind(str(tmp_path / "s")) == "store"


def test_directory_kind_refuses_paths_that_cannot_hold_a_store(tmp_path):
    from rocketspark.errors import StorePathError
    from rocketspark.store.layout import directory_kind

    afile = tmp_path / "f"
    afile.write_text("")
    for path, match in (
        (str(afile), "is a file"),
        (str(afile / "s"), "which is a file"),
        (str(tmp_path / "a\x00b"), "NUL"),
    ):
        with pytest.raises(StorePathError, match=match) as info:
            directory_kind(path)
        assert info.value.path == path


def test_the_geometry_is_recorded_once_and_read_back(tmp_path):
    from rocketspark.store.config import MessageStoreConfig
    from rocketspark.store.layout import GEOMETRY_FILE, read_geometry, record_geometry

    root = str(tmp_path)
    config = MessageStoreConfig(mapped_file_size_commit_log=8192, max_index_num=512)
    fresh = read_geometry(root, config)
    assert not fresh.recorded
    assert fresh.values["mapped_file_size_commit_log"] == 8192
    assert fresh.as_config() == dict(fresh.values)
    assert record_geometry(root, fresh) is True
    assert record_geometry(root, fresh) is False  # the first record stays
    text = (tmp_path / GEOMETRY_FILE).read_text("ascii")
    assert "mappedFileSizeCommitLog=8192\n" in text and "maxIndexNum=512\n" in text
    assert not [n for n in os.listdir(root) if n.endswith(".tmp")]
    again = read_geometry(root, MessageStoreConfig())  # defaults: the record wins
    assert again.recorded and again.values == fresh.values
    with pytest.raises(ConfigError, match="mappedFileSizeCommitLog=4096"):
        read_geometry(
            root,
            MessageStoreConfig(mapped_file_size_commit_log=4096),
            {"mappedFileSizeCommitLog": "a keyword"},
        )


def test_check_file_sizes_lists_the_files_and_names_a_wrong_size(tmp_path):
    from rocketspark.errors import SegmentSizeError
    from rocketspark.store.config import MessageStoreConfig
    from rocketspark.store.layout import check_file_sizes, read_geometry, wrong_size_files

    root = str(tmp_path / "s")
    filled_store(root, **SMALL)
    geometry = read_geometry(root, MessageStoreConfig())
    assert geometry.recorded and geometry.values["mapped_file_size_commit_log"] == 4096
    seen = check_file_sizes(root, geometry)
    on_disk = [
        os.path.join(d, n)
        for sub in ("commitlog", "consumequeue", "index")
        for d, _, names in os.walk(os.path.join(root, sub))
        for n in names
    ]
    assert sorted(seen) == sorted(on_disk) and len(seen) > 3
    assert wrong_size_files(root, geometry) == []
    seg = os.path.join(root, "commitlog", f"{4096:020d}")
    os.truncate(seg, 100)
    (wrong,) = wrong_size_files(root, geometry)
    assert wrong.file == seg and (wrong.expected, wrong.actual) == (4096, 100)
    with pytest.raises(SegmentSizeError, match="100 bytes, expected 4096"):
        check_file_sizes(root, geometry)
    assert os.path.getsize(seg) == 100  # never padded
