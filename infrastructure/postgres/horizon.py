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

import logging
from dataclasses import dataclass
from time import monotonic, sleep
from typing import Any

import psycopg
from eventsourcing.persistence import OperationalError
from psycopg import Cursor
from psycopg.sql import Composed

from flowledger.infrastructure.postgres import ddl
from flowledger.infrastructure.postgres import sql as pg_sql

_log = logging.getLogger(__name__)
_FOREIGN = "SELECT %s::xid8 >= pg_snapshot_xmax(pg_current_snapshot()) AS foreign"
# A role that may not write (a read-only user, a hot standby) leaves the repair to
# ``flowledger migrate``: the reader says so and goes on waiting as before.
_CANNOT_WRITE = (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction)


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
        self.sql_repair = _render(ddl.repair_foreign_transaction_ids(schema, table))
        self.table = f"{schema}.{table}"
        self._told_cannot_repair = False

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

    def repair_foreign(self, curs: Cursor[Any], held_back: list[str]) -> bool:
        """Whether rows held back carried transaction ids this cluster has not issued, and were
        rewritten to 0 (as ``flowledger migrate`` does; ``migrations.py``).

        A visible row's id at or past this snapshot's xmax cannot be this cluster's: its
        transaction committed, so it took its id before the snapshot. Such rows came from
        another cluster (a logical copy into a live log, which the start-up check, looking at
        the newest row only, does not see) and would hold every reader back until the
        counter reached them. The rewrite tests each row against its own statement's
        snapshot, so no append of this cluster is touched.
        """
        newest = max(held_back, key=int)
        row = curs.execute(_FOREIGN, (newest,)).fetchone()
        if not _column(row, "foreign", 0):
            return False
        try:
            curs.execute(self.sql_repair)
        except _CANNOT_WRITE as error:
            if not self._told_cannot_repair:
                self._told_cannot_repair = True
                _log.error(
                    "%s holds rows with transaction ids from another cluster (readers stop before "
                    "them) and this role cannot rewrite them (%s): run `flowledger migrate`",
                    self.table,
                    error.sqlstate,
                )
            return False
        _log.warning(
            "%s: %s rows carried transaction ids from another cluster; rewritten to 0",
            self.table,
            curs.rowcount,
        )
        return True

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
