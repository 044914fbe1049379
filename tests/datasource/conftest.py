"""The RocketMQ each test reaches (the SparkSession is shared: tests/conftest.py).

``backend`` runs a test once per backend of ``tests/helpers/backends.py``;
``store_path`` and ``store`` are for the tests marked ``embedded_only``, which
are about the embedded store's directory itself.
"""

from __future__ import annotations

import pytest

from rocketspark.client import close_all
from tests.helpers.backends import PARAMS, make_backend


@pytest.fixture(params=PARAMS)
def backend(request, tmp_path):
    yield make_backend(request, tmp_path, {})
    close_all()  # this process's handles; workers keep theirs until they exit


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
