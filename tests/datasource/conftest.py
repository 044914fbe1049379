"""A fresh store per test (the SparkSession is shared: tests/conftest.py)."""

from __future__ import annotations

import pytest

from rocketspark.client import close_all


@pytest.fixture
def store_path(tmp_path):
    path = str(tmp_path / "store")
    yield path
    close_all()  # this process's handles; workers keep theirs until they exit


@pytest.fixture
def store(store_path):
    from rocketspark.store import MessageStore

    with MessageStore.open(store_path) as s:
        yield s
