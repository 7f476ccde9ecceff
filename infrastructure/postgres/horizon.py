"""Where readers of one event log must stop: the horizon, waiting for it, and how far it lags.

The horizon is taken from the appends to this log still in flight (each holds a marker
lock from inside its id section until its commit is visible; ``sql.horizon``), not from
the oldest transaction on the server: a write left open on another table, or in another
database of the same cluster, no longer holds readers back (it stopped every projection
until it ended: 0 of 5 new events applied while one was open). Why a reader that takes
the horizon first and then reads rows below it never passes an id that commits later
is argued in docs/recorder.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import monotonic, sleep
from typing import Any

from eventsourcing.persistence import OperationalError
from psycopg import Cursor
from psycopg.sql import Composed

from flowledger.infrastructure.postgres import sql as pg_sql


@dataclass(frozen=True, kw_only=True)
class HorizonLag:
    """How far readers of the log are held behind its newest committed row."""

    readable_id: int
    """The highest notification id a reader may consume now (0: none)."""
    committed_id: int
    """The highest notification id of any committed row (0: an empty log)."""
    held_back: int
    """Committed rows after ``readable_id``: readers wait for an append still in flight before them."""
    age_s: float | None
    """Seconds the append holding them back has been open: 0.0 when nothing is held back,
    None when its start is hidden from this role (``pg_stat_activity`` of another user) or
    on a hot standby (where any transaction of the primary's cluster holds readers back)."""


class Horizon:
    """The horizon statements of one events table, rendered once."""

    def __init__(self, schema: str, table: str) -> None:
        space = pg_sql.in_flight_lock_space(schema, table)
        self.sql_horizon = _render(pg_sql.horizon(space))
        self.sql_horizon_and_oldest = _render(pg_sql.horizon_and_oldest(space))
        self.sql_lag = _render(pg_sql.horizon_lag(schema, table))

    def read(self, curs: Cursor[Any], *, prepare: bool | None) -> str:
        """The horizon now (a decimal transaction id): run it before the statement that reads rows."""
        row = curs.execute(self.sql_horizon, prepare=prepare).fetchone()
        return str(_column(row, "horizon", 0))

    def wait_past(self, curs: Cursor[Any], tx: str, deadline: float, *, prepare: bool | None) -> str:
        """Poll until the horizon passes transaction ``tx`` (every append before it finished), or
        ``deadline``; returns the last horizon read (read rows after it, not before)."""
        delay = 0.0005
        while True:
            horizon = self.read(curs, prepare=prepare)
            if int(horizon) > int(tx) or monotonic() >= deadline:
                return horizon
            sleep(delay)
            delay = min(delay * 2, 0.02)

    def lag(self, curs: Cursor[Any], *, prepare: bool | None) -> HorizonLag:
        """The readable and committed heads, the rows between them, and how long they have waited."""
        row = curs.execute(self.sql_horizon_and_oldest, prepare=prepare).fetchone()
        horizon, in_flight, oldest_s = (_column(row, name, i) for i, name in enumerate(_OLDEST))
        row = curs.execute(self.sql_lag, (horizon,), prepare=prepare).fetchone()
        readable, committed, held_back = (int(_column(row, name, i)) for i, name in enumerate(_LAG))
        # Rows held back with nothing in flight: committed between the two statements.
        age: float | None = 0.0
        if held_back and in_flight:
            age = None if oldest_s is None else max(0.0, float(oldest_s))
        return HorizonLag(readable_id=readable, committed_id=committed, held_back=held_back, age_s=age)


_OLDEST = ("horizon", "in_flight", "oldest_s")
_LAG = ("readable", "committed", "held_back")


def _render(statement: Composed) -> str:
    # Rendered once to a plain string: psycopg caches a string query's parse, but renders
    # a ``Composed`` again on every call.
    return statement.as_string(None)


def _column(row: Any, name: str, index: int) -> Any:
    """A column of a dict row (the library's cursors) or a tuple row."""
    if row is None:
        raise OperationalError("a horizon statement returned no row")
    return row[name] if isinstance(row, dict) else row[index]
