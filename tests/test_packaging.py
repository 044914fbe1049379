"""rocketspark installed as a user installs it: a wheel built from the checkout, and
``pip install -e .``, each in a fresh virtual environment, where ``format("rocketmq")``
must work with no registration call.

Spark finds the data source by listing top-level ``pyspark_*`` modules with
``pkgutil.iter_modules`` (pyspark/sql/worker/lookup_data_sources.py): the wheel must
hold ``pyspark_rocketmq``, and an editable install must leave it visible to that
listing. The environments see pyspark, pyarrow and numpy through a ``.pth`` naming
this interpreter's site-packages (so nothing is downloaded), but not the checkout:
they run outside it, with no PYTHONPATH, and every check also asserts that what was
imported came from the installed copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import rocketspark

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv*",
    ".jars",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
)

# Run inside the fresh environment: Spark's own lookup of Python data sources (the
# function its lookup worker runs), then where things were imported from.
LOOKUP = """
import importlib.metadata, io, json, os, struct, sys
from pyspark.sql.worker.lookup_data_sources import _main

out = io.BytesIO()
_main(io.BytesIO(), out)
data = out.getvalue()
names = []
(count,) = struct.unpack_from(">i", data, 0)
at = 4
for _ in range(count):
    (n,) = struct.unpack_from(">i", data, at)
    names.append(data[at + 4 : at + 4 + n].decode())
    (n,) = struct.unpack_from(">i", data, at + 4 + n)  # the pickled DefaultSource
    at += 4 + len(names[-1].encode()) + 4 + n

import pyspark_rocketmq, rocketspark

package = os.path.dirname(rocketspark.__file__)
print(json.dumps({
    "sources": names,
    "module": pyspark_rocketmq.__file__,
    "package": package,
    "version": importlib.metadata.version("rocketspark"),
    "files": sorted(
        os.path.relpath(os.path.join(d, f), package)
        for d, dirs, fs in os.walk(package)
        if "__pycache__" not in d
        for f in fs
        if not f.endswith(".pyc")
    ),
}))
"""

# A short batch read through format("rocketmq") in a local Spark, no register() call.
READ = """
import sys
from rocketspark.session import local_session
from rocketspark.store import Message, MessageStore

with MessageStore.open(sys.argv[1]) as store:
    store.create_topic("T", queues=2)
    store.put_batch([Message("T", b"m%d" % i) for i in range(5)])
spark = local_session("rocketspark-packaging", master="local[1]", delta=False)
rows = spark.read.format("rocketmq").option("store", sys.argv[1]).option("topic", "T").load()
print(sorted(r.body.decode() for r in rows.select("body").collect()))
spark.stop()
"""


def _run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(kw.pop("env", {}))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)


def _source_tree() -> list[str]:
    """The package's files, as the checkout has them (what a wheel must hold)."""
    package = ROOT / "rocketspark"
    return sorted(
        str(p.relative_to(package))
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _fresh_venv(path: Path) -> Path:
    """A virtual environment without pip that sees this interpreter's packages (not
    the checkout, and not what its .pth files add: those of a directory named in a
    .pth are not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=path,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "test-packages.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


def _pip_install(python: Path, *args: str, cwd: Path) -> None:
    r = _run([sys.executable, "-m", "pip", "--python", str(python), "install", *args], cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr


def _lookup(python: Path, cwd: Path) -> dict:
    r = _run([str(python), "-c", LOOKUP], cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout: building writes build/ and *.egg-info into the tree."""
    src = tmp_path_factory.mktemp("src") / "rocketspark"
    shutil.copytree(ROOT, src, ignore=IGNORED)
    return src


@pytest.fixture(scope="module")
def wheel_venv(source, tmp_path_factory) -> Path:
    """A fresh environment with the wheel built from the checkout installed."""
    dist = tmp_path_factory.mktemp("dist")
    r = _run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(dist)],
        cwd=dist,
    )
    if r.returncode != 0 and "satisfies the requirement setuptools" in r.stdout + r.stderr:
        if os.environ.get("CI"):
            pytest.fail(f"cannot fetch the build backend: {r.stderr}")
        pytest.skip("no package index to fetch setuptools (the build backend) from")
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = dist.glob("rocketspark-*.whl")
    python = _fresh_venv(tmp_path_factory.mktemp("wheel") / "venv")
    _pip_install(python, "--no-deps", "--no-index", str(wheel), cwd=dist)
    return python


def test_the_wheel_holds_the_package_and_registers_format_rocketmq(wheel_venv, tmp_path):
    venv = wheel_venv.parent.parent
    found = _lookup(wheel_venv, tmp_path)
    assert "rocketmq" in found["sources"], found["sources"]
    assert Path(found["module"]).is_relative_to(venv), found["module"]
    assert Path(found["package"]).is_relative_to(venv), found["package"]
    assert found["files"] == _source_tree()  # every module and data file, nothing else
    assert found["version"] == rocketspark.__version__
    r = _run([str(venv / "bin" / "rocketspark"), "--version"], cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"rocketspark {rocketspark.__version__}"


@pytest.mark.spark
def test_the_wheel_reads_a_topic_through_spark_with_no_registration(wheel_venv, tmp_path):
    r = _run(
        [str(wheel_venv), "-c", READ, str(tmp_path / "store")],
        cwd=tmp_path,
        env={"PYSPARK_PYTHON": str(wheel_venv), "PYSPARK_DRIVER_PYTHON": str(wheel_venv)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == str([f"m{i}" for i in range(5)])


def test_an_editable_install_leaves_pyspark_rocketmq_visible_to_spark(source, tmp_path):
    """`pip install -e .` must not install an import hook instead of a path: Spark's
    pkgutil.iter_modules does not see modules such a hook serves."""
    python = _fresh_venv(tmp_path / "venv")
    _pip_install(python, "--no-deps", "-e", str(source), cwd=tmp_path)
    found = _lookup(python, tmp_path)
    assert "rocketmq" in found["sources"], found["sources"]
    assert Path(found["module"]) == source / "pyspark_rocketmq.py"
    assert Path(found["package"]) == source / "rocketspark"
