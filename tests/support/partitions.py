"""Run a test module's PostgreSQL tests against both event-log layouts (issue 17, item 3).

A module sets ``pytest_generate_tests = both_layouts``: each of its tests that uses the
``pg_schema`` fixture (directly or through ``pg_engine``) runs twice, once on the
one-table log and once on a log hash-partitioned by stream into ``PARTITIONS`` partitions.
The partitioned schema is migrated before the test (``pg_schema`` in tests/conftest.py);
engines and hand-built recorders the test starts later find the table there and keep its
layout (an engine's start never changes it).
"""

from __future__ import annotations

import pytest

PARTITIONS = 4
"""The partitioned layout the tests run on."""

LAYOUTS = (0, PARTITIONS)


def layout_id(partitions: int) -> str:
    """``one-table`` or ``4-partitions`` in the test's id."""
    return f"{partitions}-partitions" if partitions else "one-table"


def both_layouts(metafunc: pytest.Metafunc) -> None:
    """``pytest_generate_tests`` of a module: ``pg_schema`` parametrised over ``LAYOUTS``."""
    if "pg_schema" in metafunc.fixturenames:
        metafunc.parametrize("pg_schema", LAYOUTS, indirect=True, ids=layout_id)
