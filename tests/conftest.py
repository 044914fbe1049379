"""Shared fixtures: a fake clock, and one SparkSession, one RocketMQ cluster and one
``rocketspark serve`` for the whole run."""

from __future__ import annotations

import os

import pytest


class FakeClock:
    """A settable millisecond clock for delay levels, retries and transaction checks."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broker: starts a real Apache RocketMQ NameServer and broker (JVMs; "
        "deselect with -m 'not broker')",
    )
    config.addinivalue_line(
        "markers",
        "embedded_only: about the embedded store's directory itself (its files, its "
        "clock, a process writing it); runs on a store, not on every backend",
    )
    config.addinivalue_line(
        "markers",
        "cluster: uses the real RocketMQ cluster of the run (rocketmq_cluster: JVMs; "
        "deselect with -m 'not cluster')",
    )
    config.addinivalue_line(
        "markers",
        "not_on_serve: a long test run on the other backends, not on serve (CI time); "
        "what it covers of a broker, a shorter test of the same file covers on serve",
    )
    config.addinivalue_line(
        "markers",
        "serve: uses the run's rocketspark serve (rocketspark_serve: a server process; "
        "deselect with -m 'not serve')",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``cluster`` every test that uses the run's cluster, ``serve`` every one that
    uses its server (before ``-m`` selects); a test run on the backends of
    ``tests/helpers/backends.py`` gets its parameter's mark there."""
    for item in items:
        if "rocketmq_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        if "rocketspark_serve" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serve)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def spark():
    """One SparkSession (local[2], Delta configured) for the whole test run.

    ROCKETSPARK_TEST_DELTA=0 leaves Delta out: for runs of the data source tests
    on Spark 4.0 / 4.1, which delta-spark 4.4 does not support.
    """
    from rocketspark.session import local_session

    delta = os.environ.get("ROCKETSPARK_TEST_DELTA", "1") != "0"
    session = local_session("rocketspark-tests", delta=delta)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def rocketmq_java(tmp_path_factory):
    """RocketMQ's jars and the Java test programs (compiled on first use) for the run.

    Skips without java, javac or ``./dev``'s jars; under CI (``$CI`` set) fails instead.
    """
    from tests.helpers import jvm
    from tests.helpers.rocketmq import JavaPrograms

    broker_cp, namesrv_cp = jvm.need_java(jvm.ROCKETMQ, jvm.NAMESRV)
    return JavaPrograms(tmp_path_factory.mktemp("java"), broker_cp, namesrv_cp)


@pytest.fixture(scope="session")
def rocketmq_cluster(rocketmq_java, tmp_path_factory):
    """A real RocketMQ for the whole run: a NameServer and the masters broker-a and
    broker-b (DefaultCluster) on loopback, started when a test first asks for it and
    stopped (SIGTERM) when the run ends. See ``tests/helpers/cluster.py`` for its API.
    """
    from tests.helpers.cluster import Cluster

    cluster = Cluster(rocketmq_java, tmp_path_factory.mktemp("rocketmq-cluster"))
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def rocketspark_serve(tmp_path_factory):
    """``rocketspark serve`` for the whole run, over a store of its own on free loopback
    ports, started when a test first asks for it and stopped (SIGTERM: it must exit 0,
    flushed and checkpointed) when the run ends. See ``tests/helpers/serve.py``.
    """
    from tests.helpers.serve import ServeProcess

    server = ServeProcess(tmp_path_factory.mktemp("rocketspark-serve"))
    yield server
    code = server.close()
    if code != 0:
        raise RuntimeError(f"rocketspark serve stopped with {code}:\n{server.tail()}")
