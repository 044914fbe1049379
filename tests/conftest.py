"""Shared fixtures. Spark fixtures (one session per run) join here with the data source."""

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
