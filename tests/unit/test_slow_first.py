"""``tests/slow_first.txt`` names tests that exist, and the run starts with them, each followed by
the rest of its module."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import pytest_collection_modifyitems, slow_first_names

ROOT = Path(__file__).resolve().parents[2]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_listed_slow_test_exists() -> None:
    names = slow_first_names()
    assert names, "tests/slow_first.txt lists no test"
    missing = []
    for name in sorted(names):
        path, _, function = name.partition("::")
        if not (ROOT / path).is_file() or function not in _functions(ROOT / path):
            missing.append(name)
    assert not missing, f"tests/slow_first.txt names tests that are not there: {missing}"


class _Item:
    """What the ordering reads of a collected test."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.fixturenames: list[str] = []

    def add_marker(self, marker: object) -> None:
        raise AssertionError("no test here uses a database fixture")


def test_the_listed_tests_come_first_and_the_others_keep_their_order() -> None:
    slow = sorted(slow_first_names())
    names = [
        "tests/unit/test_a.py::test_one",
        f"{slow[1]}[one-table]",
        "tests/unit/test_a.py::test_two",
        slow[0],
    ]
    items = [_Item(name) for name in names]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [names[1], names[3], names[0], names[2]]


def test_the_rest_of_a_listed_tests_module_follows_it_so_module_fixtures_are_set_up_once() -> None:
    listed = sorted(slow_first_names())[0]
    module = listed.split("::", 1)[0]
    names = [
        "tests/unit/test_a.py::test_one",
        f"{module}::test_not_listed[x]",
        "tests/unit/test_a.py::test_two",
        listed,
        f"{module}::test_not_listed_either",
    ]
    items = [_Item(name) for name in names]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [names[3], names[1], names[4], names[0], names[2]]
