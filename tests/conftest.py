"""Shared fixtures: a fake clock, and one SparkSession for the whole run."""

from __future__ import annotations

import pytest


class FakeClock:
    """A settable millisecond clock for delay levels, retries and transaction checks."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def spark():
    """One SparkSession (local[2], Delta configured) for the whole test run."""
    from rocketspark.session import local_session

    session = local_session("rocketspark-tests")
    yield session
    session.stop()
