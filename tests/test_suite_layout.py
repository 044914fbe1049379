"""The test suite's own layout: test directories have no ``__init__.py``, so pytest
imports each test module by its file name alone, and two files of one name in two
directories stop the whole run at collection ("import file mismatch")."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_file_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
