"""Shared fixtures: a fake clock, and one SparkSession for the whole run."""

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
