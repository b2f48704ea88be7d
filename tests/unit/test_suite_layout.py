"""The suite's own layout: pytest imports test modules by basename (no __init__.py, prepend mode), so two
test files with the same name in different folders stop `make test` at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
