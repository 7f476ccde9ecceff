"""psycopg's errors surface as the event library's, as its own recorder raises them."""

from __future__ import annotations

import psycopg
import pytest
from eventsourcing.persistence import (
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    PersistenceError,
    ProgrammingError,
)
from psycopg import errors
from psycopg_pool import PoolTimeout

from flowledger.infrastructure.postgres.recorder_errors import library_error


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (errors.UniqueViolation("duplicate key"), IntegrityError),  # a version clash
        (PoolTimeout("no connection"), OperationalError),  # retried by the recorder
        (psycopg.InterfaceError("closed"), InterfaceError),
        (errors.NumericValueOutOfRange("too big"), DataError),
        (errors.UndefinedTable("no table"), ProgrammingError),
        (psycopg.Error("other"), PersistenceError),
    ],
)
def test_each_psycopg_error_maps_to_the_library_error(raised: psycopg.Error, expected: type) -> None:
    mapped = library_error(raised)
    assert type(mapped) is expected
    assert str(raised) in str(mapped)
