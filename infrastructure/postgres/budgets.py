"""The budget ledger in PostgreSQL: budgets, one row per budget window, open reservations.

``<schema>.budgets`` holds each budget's current terms (kept in step with the Budget
aggregate's events by ``BudgetService``); ``budget_windows`` holds, per budget and window,
the recorded spend, the sum of open reservations and the alert thresholds already raised;
``budget_reservations`` holds each reservation, with an expiry so that a crashed worker's
hold lapses. A reservation locks its windows ``FOR UPDATE`` in budget-id order (no
deadlock between two calls sharing budgets) and admits the call only while
``spent + reserved + estimate <= limit`` for every enforced budget: see docs/budgets.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Context, Decimal, localcontext
from typing import Any
from uuid import UUID

from psycopg import Connection, sql
from psycopg.rows import dict_row

from flowledger.domain.budget import THRESHOLDS, BudgetAlert, BudgetSpec, CallScope, window_start
from flowledger.domain.errors import BudgetExceeded, BudgetLedgerDamaged
from flowledger.domain.pricing import EXACT
from flowledger.infrastructure.postgres import budget_leases
from flowledger.infrastructure.postgres.database import deadlines_of
from flowledger.infrastructure.postgres.ddl import create_budget_tables
from flowledger.infrastructure.postgres.lazy_pool import LazyPool
from flowledger.infrastructure.settings import Settings

_log = logging.getLogger(__name__)

_MATCHING = """
SELECT budget_id, scope, subject, period, limit_usd, mode, webhook_url, webhook_secret
FROM {budgets}
WHERE tenant = %(tenant)s AND (
    (scope = 'tenant' AND subject = %(tenant)s) OR (scope = 'user' AND subject = %(user)s)
    OR (scope = 'session' AND subject = %(session)s) OR (scope = 'workflow' AND subject = %(workflow)s)
    OR (scope = 'model' AND subject = %(model)s))
ORDER BY budget_id
"""


_NO_FLUSH = "SET LOCAL synchronous_commit = off"
"""Reservations and settlements do not wait for their own WAL flush: on the shared dev
machine that wait was 20 of a reservation's 25 ms. Holds are transient; a settlement is
flushed by the step event's commit that follows it (WAL is flushed in order), so it is
durable as soon as the step is."""
_WINDOW_OF = "CASE b.period WHEN 'day' THEN %(day)s WHEN 'month' THEN %(month)s ELSE %(total)s END"
_MAKE_WINDOWS = (
    "INSERT INTO {windows} (budget_id, window_start) SELECT b.budget_id, "
    + _WINDOW_OF
    + " FROM ("
    + _MATCHING
    + " FOR KEY SHARE) b ON CONFLICT DO NOTHING"
)
"""The call's windows, made where missing, of the budgets it matches, each budget row locked
against removal (``FOR KEY SHARE``: setting its terms is not blocked) until the reservation
ends. Read without the lock, a budget removed (and its removal committed) while the window
was written failed the foreign key: the call's step failed as ``ForeignKeyViolation``, HTTP
500 (6 of 120 calls while two servers set and removed their budget over and over). A budget
removed meanwhile is not matched: the removal waits, or the call finds it gone."""
_LOCK_WINDOWS = (
    "SELECT b.budget_id, b.scope, b.subject, b.period, b.limit_usd, b.mode, b.webhook_url, b.webhook_secret,"
    " w.window_start, w.spent_usd, w.reserved_usd, (SELECT coalesce(sum(r.amount_usd), 0) FROM {holds} r"
    " WHERE r.budget_id = w.budget_id AND r.window_start = w.window_start AND r.expires_at < %(now)s)"
    " AS lapsed_usd FROM (" + _MATCHING + ") b JOIN {windows} w ON w.budget_id = b.budget_id"
    " AND w.window_start = " + _WINDOW_OF + " ORDER BY b.budget_id FOR UPDATE OF w"
)
"""The call's windows, locked in budget-id order, with what their lapsed holds amount to."""
_HOLD = """
WITH gone AS (
    DELETE FROM {holds} r USING unnest(%(ids)s::uuid[], %(starts)s::timestamptz[]) AS u(b, s)
    WHERE r.budget_id = u.b AND r.window_start = u.s AND r.expires_at < %(now)s
), held AS (
    INSERT INTO {holds} (reservation_id, budget_id, window_start, amount_usd, expires_at)
    SELECT %(reservation)s, b, s, %(estimate)s, %(expires)s
    FROM unnest(%(ids)s::uuid[], %(starts)s::timestamptz[]) AS u(b, s)
)
UPDATE {windows} w SET reserved_usd = greatest(w.reserved_usd - u.lapsed, 0) + %(estimate)s
FROM unnest(%(ids)s::uuid[], %(starts)s::timestamptz[], %(lapsed)s::numeric[]) AS u(b, s, lapsed)
WHERE w.budget_id = u.b AND w.window_start = u.s
"""
"""Release the lapsed holds (summed under the same lock) and hold the estimate, in one statement."""
_SETTLED_WINDOW = _WINDOW_OF.replace("%(", "%(at_")
"""The window of a budget (``b``) holding the settlement's moment (``at_day`` ...)."""
_MAKE_SETTLED_WINDOWS = (
    "INSERT INTO {windows} (budget_id, window_start) SELECT b.budget_id, "
    + _SETTLED_WINDOW
    + " FROM (SELECT budget_id, period FROM {budgets} WHERE budget_id = ANY(%(ids)s) ORDER BY budget_id"
    " FOR KEY SHARE) b ON CONFLICT DO NOTHING"
)
"""The windows a settlement spends in, made where missing (a call held before midnight and
settled after it spends in the new day), each budget locked against removal as a reservation
locks it."""
_LOCK_SETTLED = (
    "SELECT 1 FROM {windows} w JOIN {budgets} b ON b.budget_id = w.budget_id"
    " JOIN unnest(%(ids)s::uuid[], %(starts)s::timestamptz[]) AS u(id, s) ON w.budget_id = u.id"
    " WHERE w.window_start = u.s OR w.window_start = " + _SETTLED_WINDOW + ""
    " ORDER BY w.budget_id, w.window_start FOR UPDATE OF w"
)
"""The held and the settled windows, locked in budget-id order (then by start: two windows of
one budget when a day or month ended while the call ran)."""
_SETTLE = (
    """
WITH gone AS (
    DELETE FROM {holds} WHERE reservation_id = %(reservation)s RETURNING budget_id, window_start, amount_usd
)
UPDATE {windows} w SET spent_usd = w.spent_usd
        + CASE WHEN w.window_start <> """
    + _SETTLED_WINDOW
    + """ THEN 0
        WHEN EXISTS (SELECT 1 FROM gone) THEN %(cost)s
        WHEN NOT %(always)s THEN 0
        WHEN EXISTS (SELECT 1 FROM {charges} WHERE charge_id = %(reservation)s)
        THEN greatest(%(cost)s - %(held)s, 0) ELSE %(cost)s END,
    reserved_usd = greatest(w.reserved_usd - coalesce((SELECT sum(g.amount_usd) FROM gone g
        WHERE g.budget_id = w.budget_id AND g.window_start = w.window_start), 0), 0)
FROM {budgets} b, unnest(%(ids)s::uuid[], %(starts)s::timestamptz[]) AS u(id, s)
WHERE w.budget_id = u.id AND b.budget_id = w.budget_id
    AND (w.window_start = u.s OR w.window_start = """
    + _SETTLED_WINDOW
    + """)
RETURNING w.budget_id, w.window_start, w.spent_usd, w.alerted, b.scope, b.subject, b.period, b.limit_usd,
    b.mode, b.webhook_url, b.webhook_secret, w.window_start = """
    + _SETTLED_WINDOW
    + """ AS settled_here
"""
)
"""Put the call's cost in place of its hold: the hold leaves the window it was taken in, the cost
goes to the window holding the settlement's moment, the same as the cost dashboard's (its
event's stamp). A lapsed hold is gone already: only the cost is added, unless ``always`` is
false: a settlement tried again adds nothing once its hold is gone; one whose hold a takeover
spent at its estimate, ``_SPENT_MARK``, adds only what the cost passes it by."""
_SPEND_HELD = """
WITH gone AS (
    DELETE FROM {holds} WHERE reservation_id = %(reservation)s RETURNING budget_id, window_start, amount_usd
)
UPDATE {windows} w SET spent_usd = w.spent_usd + g.amount_usd,
    reserved_usd = greatest(w.reserved_usd - g.amount_usd, 0)
FROM gone g, {budgets} b
WHERE w.budget_id = g.budget_id AND w.window_start = g.window_start AND b.budget_id = w.budget_id
RETURNING w.budget_id, w.window_start, w.spent_usd, w.alerted, b.scope, b.subject, b.period, b.limit_usd,
    b.mode, b.webhook_url, b.webhook_secret
"""
"""Turn a hold into spend of its own amount (windows locked first, in budget-id order)."""
_SPENT_MARK = "INSERT INTO {charges} (charge_id) VALUES (%(reservation)s) ON CONFLICT DO NOTHING"
"""A hold spent at its estimate, remembered by its id, so that its worker's late settlement (alive
after all: cut off from the database past its lease, its step taken over) counts the call at the
larger of its estimate and its cost, not at both: a $0.40 hold spent so and then settled at $0.10
left $0.50 spent for one call (its cost may pass one estimate: several billed attempts)."""


@dataclass(frozen=True, kw_only=True)
class BudgetRow:
    """A budget's terms as the ledger holds them."""

    budget_id: UUID
    spec: BudgetSpec
    webhook_secret: str | None = None


@dataclass(frozen=True, kw_only=True)
class Burn:
    """A budget and its current window: spent, reserved, and the share of the limit they take."""

    budget_id: UUID
    spec: BudgetSpec
    window_start: datetime
    spent_usd: Decimal
    reserved_usd: Decimal

    @property
    def percent(self) -> Decimal:
        """Recorded spend as a percentage of the limit, cut (not rounded) to 2 decimals, so it
        shows a threshold reached exactly when its alert fires (``spent * 100 >= limit * t``):
        rounded half-even, $9.9995 of $10 showed 100.00 % with no 100 % alert raised.

        Worked out in a context of its own: in an embedding service's ``getcontext().prec = 6``
        an alert budget spent past 10,000 % of its limit raised InvalidOperation (the quantized
        figure needs more digits than 6). A limit has at most 12 decimals, so 100 digits hold
        the percentage of any spend. NaN when an amount is no number (a row edited in the
        database to ``NaN`` or ``Infinity``): the dashboard page's panel raised InvalidOperation
        on it, a 500 for the whole page."""
        if not (self.spent_usd.is_finite() and self.spec.limit_usd.is_finite()):
            return Decimal("NaN")
        with localcontext(Context(prec=100)):
            return (self.spent_usd * 100 / self.spec.limit_usd).quantize(Decimal("0.01"), rounding=ROUND_DOWN)


@dataclass(frozen=True)
class Reservation:
    """A call's hold on the windows of every budget it is charged to."""

    reservation_id: UUID
    windows: tuple[tuple[UUID, datetime], ...]
    amount_usd: Decimal


@dataclass(frozen=True)
class Raised:
    """An alert the ledger decided to raise (exactly once per threshold and window)."""

    alert: BudgetAlert
    budget_id: UUID
    webhook_secret: str | None


class PostgresBudgetLedger:
    """Budgets, their windows and reservations in one schema; tables made on first use."""

    def __init__(self, database_url: str, schema: str, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self._schema = schema
        self._pool = LazyPool(
            database_url,
            operation="budgets",
            deadlines=deadlines_of(settings),
            max_size=max(2, settings.pool_size),
            prepare=self._prepare,
        )
        self._t = {
            name: sql.Identifier(schema, name)
            for name in (
                "budgets",
                "budget_windows",
                "budget_reservations",
                "budget_charges",
                "budget_idle_leases",
            )
        }

    def close(self) -> None:
        """Close the connections."""
        self._pool.close()

    def _connection(self) -> AbstractContextManager[Connection[Any]]:
        """A pooled connection for one operation: its statements end with the deadline."""
        return self._pool.connection()

    def _prepare(self, conn: Connection[Any]) -> None:
        """Make the tables unless ``migrate`` (schema version 8) did: one read, where the DDL
        took a lock and a commit inside the first step of every new engine."""
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            [sql.Identifier(self._schema, "budget_idle_leases").as_string(conn)],
        ).fetchone()
        if not (row and row[0]):
            self._create_tables(conn)

    def _create_tables(self, conn: Connection[Any]) -> None:
        """Tables for a schema ``migrate`` has not brought to version 5 (a schema made otherwise)."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"{self._schema}.budgets"])
            for statement in create_budget_tables(self._schema):
                conn.execute(statement)

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(
            budgets=self._t["budgets"],
            windows=self._t["budget_windows"],
            holds=self._t["budget_reservations"],
            charges=self._t["budget_charges"],
        )

    # -- terms -------------------------------------------------------------------------

    def put(
        self,
        tenant: str,
        budget_id: UUID,
        spec: BudgetSpec,
        webhook_secret: str | None,
        *,
        latest: Callable[[], BudgetSpec | None] | None = None,
        holder: UUID | None = None,
    ) -> float:
        """Insert or replace a budget's terms (its windows and their spend are kept); the seconds
        other engines (holders other than ``holder``) may still skip this tenant's reservations,
        having seen it without budgets just before (``budget_leases``): wait that long before
        telling anyone the budget holds.

        With ``latest`` (the budget's terms as its events last recorded them, None when
        removed), the row is written from it under the budget's lock, after the event that
        ``spec`` was recorded by: two processes setting one budget (or one removing it) each
        write the row after their event, and the slower write put its own older terms back
        over the newer ones. The secret is ``webhook_secret`` while ``spec`` is still the
        latest; otherwise the row keeps its own.

        A window keeps, of the alerts it raised, those its spend still reaches under the new
        limit: raised, the limit's thresholds are raised again as the spend reaches them (the
        old limit's 50 % stopped the new one's for the rest of the window); lowered, those the
        spend already passes are raised by the next call settled.
        """
        with self._connection() as conn, conn.transaction():
            keep_secret = False
            budget_leases.lock_tenant(conn, self._schema, tenant, shared=False)
            if latest is not None:
                self._lock_budget(conn, budget_id)
                current = latest()
                if current is None:  # removed since: its removal stands
                    conn.execute(self._sql("DELETE FROM {budgets} WHERE budget_id = %s"), [budget_id])
                    return 0.0
                keep_secret = current != spec
                spec = current
            if spec.webhook_url is None:
                webhook_secret = None
            conn.execute(
                self._sql(
                    "INSERT INTO {budgets} (budget_id, tenant, scope, subject, period, limit_usd, mode,"
                    " webhook_url, webhook_secret) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (budget_id) DO UPDATE SET limit_usd = EXCLUDED.limit_usd,"
                    " mode = EXCLUDED.mode, webhook_url = EXCLUDED.webhook_url,"
                    " webhook_secret = CASE WHEN %s AND EXCLUDED.webhook_url IS NOT NULL"
                    " THEN {budgets}.webhook_secret ELSE EXCLUDED.webhook_secret END, updated_at = now()"
                ),
                [budget_id, tenant, spec.scope, spec.subject, spec.period, spec.limit_usd, spec.mode,
                 spec.webhook_url, webhook_secret, keep_secret],
            )  # fmt: skip
            conn.execute(
                self._sql(
                    "UPDATE {windows} SET alerted = ARRAY(SELECT t FROM unnest(alerted) AS t"
                    " WHERE spent_usd * 100 >= %(limit)s * t ORDER BY t)"
                    " WHERE budget_id = %(id)s AND cardinality(alerted) > 0"
                ),
                {"id": budget_id, "limit": spec.limit_usd},
            )
            return budget_leases.leased_for(conn, self._t, tenant, holder)

    def delete(self, budget_id: UUID, *, latest: Callable[[], BudgetSpec | None] | None = None) -> bool:
        """Drop a budget with its windows and reservations; False when there was none. With
        ``latest`` (as for ``put``), under the budget's lock, and only while the budget's
        events still say it is removed: set again since, its new terms stand."""
        with self._connection() as conn, conn.transaction():
            if latest is not None:
                self._lock_budget(conn, budget_id)
                if latest() is not None:
                    return False
            cursor = conn.execute(self._sql("DELETE FROM {budgets} WHERE budget_id = %s"), [budget_id])
            return bool(cursor.rowcount == 1)

    def _lock_budget(self, conn: Connection[Any], budget_id: UUID) -> None:
        """The lock every write of a budget's terms takes (until its transaction ends), in any process."""
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"{self._schema}.budget:{budget_id}"]
        )

    def find(self, budget_id: UUID) -> BudgetRow | None:
        """A budget's terms, or None."""
        with self._connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            row = cursor.execute(
                self._sql(
                    "SELECT budget_id, scope, subject, period, limit_usd, mode, webhook_url, webhook_secret"
                    " FROM {budgets} WHERE budget_id = %s"
                ),
                [budget_id],
            ).fetchone()
        return None if row is None else _row(row)

    def has_budgets(self, tenant: str, *, holder: UUID | None = None, lease_s: float = 0.0) -> bool:
        """Whether the tenant has any budget (one indexed probe); with ``holder``, an answer of
        none is that holder's lease for ``lease_s`` seconds (``budget_leases.probe``)."""
        if holder is not None:
            with self._connection() as conn, conn.transaction():
                return budget_leases.probe(conn, self._t, self._schema, tenant, holder, lease_s)
        with self._connection() as conn:
            row = conn.execute(
                self._sql("SELECT EXISTS (SELECT 1 FROM {budgets} WHERE tenant = %s)"), [tenant]
            ).fetchone()
        return bool(row and row[0])

    def burn(self, tenant: str, now: datetime) -> list[Burn]:
        """Every budget of the tenant with its current window's spent and reserved amounts;
        a lapsed hold is not reserved (the next reservation on its window releases its row, but
        with no call since, a dead worker's hold was listed as reserved for good)."""
        query = self._sql(
            "SELECT b.budget_id, b.scope, b.subject, b.period, b.limit_usd, b.mode, b.webhook_url,"
            " CASE b.period WHEN 'day' THEN %(day)s WHEN 'month' THEN %(month)s ELSE %(total)s END AS start,"
            " coalesce(w.spent_usd, 0) AS spent_usd, greatest(coalesce(w.reserved_usd, 0) - coalesce(("
            "SELECT sum(r.amount_usd) FROM {holds} r WHERE r.budget_id = w.budget_id"
            " AND r.window_start = w.window_start AND r.expires_at < %(now)s), 0), 0) AS reserved_usd"
            " FROM {budgets} b LEFT JOIN {windows} w ON w.budget_id = b.budget_id AND w.window_start ="
            " CASE b.period WHEN 'day' THEN %(day)s WHEN 'month' THEN %(month)s ELSE %(total)s END"
            " WHERE b.tenant = %(tenant)s ORDER BY b.scope, b.subject, b.period"
        )
        starts = {p: window_start(p, now) for p in ("day", "month", "total")}
        with self._connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            rows = cursor.execute(query, {"tenant": tenant, "now": now, **starts}).fetchall()
        return [
            Burn(
                budget_id=r["budget_id"],
                spec=_row(r).spec,
                window_start=r["start"],
                spent_usd=r["spent_usd"],
                reserved_usd=r["reserved_usd"],
            )
            for r in rows
        ]

    # -- reservations ------------------------------------------------------------------

    def reserve(
        self, scope: CallScope, estimate: Decimal, now: datetime, ttl: timedelta, reservation_id: UUID
    ) -> Reservation | None:
        """Hold ``estimate`` in the current window of every budget the call is charged to.

        None when no budget applies. Raises BudgetExceeded (holding nothing) when an
        enforced budget's ``spent + reserved + estimate`` would pass its limit. Tried again
        after a lost connection; a try after one whose reply was lost finds its hold.
        """

        def attempt(again: bool) -> Reservation | None:
            held = self._held(reservation_id) if again else None
            return held or self._reserve(scope, estimate, now, ttl, reservation_id)

        return self._pool.tried_again(attempt)

    def _held(self, reservation_id: UUID) -> Reservation | None:
        """The hold ``reservation_id`` as made, or None when there is none."""
        with self._connection() as conn:
            rows = conn.execute(
                self._sql(
                    "SELECT budget_id, window_start, amount_usd FROM {holds}"
                    " WHERE reservation_id = %s ORDER BY budget_id"
                ),
                [reservation_id],
            ).fetchall()
        if not rows:
            return None
        return Reservation(reservation_id, tuple((row[0], row[1]) for row in rows), rows[0][2])

    def _reserve(
        self, scope: CallScope, estimate: Decimal, now: datetime, ttl: timedelta, reservation_id: UUID
    ) -> Reservation | None:
        params = {**_params(scope), **_starts(now), "now": now}
        # Two round trips, pipelined: (BEGIN, make the windows, lock and read them), then
        # (release lapsed holds, hold this call's estimate, COMMIT). Measured before on this
        # machine: nine round trips took 30 ms a reservation.
        with self._connection() as conn, conn.pipeline(), conn.transaction():
            made, locked = conn.cursor(), conn.cursor(row_factory=dict_row)
            made.execute(_NO_FLUSH)
            made.execute(self._sql(_MAKE_WINDOWS), params)
            locked.execute(self._sql(_LOCK_WINDOWS), params)
            rows = locked.fetchall()
            if not rows:
                return None
            for window in rows:
                budget = _row(window)
                if budget.spec.mode != "enforce":
                    continue
                figures = {
                    "scope": budget.spec.scope,
                    "subject": budget.spec.subject,
                    "period": budget.spec.period,
                    "limit_usd": budget.spec.limit_usd,
                    "spent_usd": window["spent_usd"],
                    "reserved_usd": window["reserved_usd"],
                    "estimate_usd": estimate,
                }
                if (damaged := _not_an_amount(budget, window)) is not None:
                    raise BudgetLedgerDamaged(str(budget.budget_id), **damaged, **figures)
                with localcontext(EXACT):  # not the thread's context: it may round
                    spent, reserved = window["spent_usd"], window["reserved_usd"] - window["lapsed_usd"]
                    held = spent + reserved + estimate
                # A spent budget refuses even a call of unknown (zero) estimate.
                if held > budget.spec.limit_usd or spent >= budget.spec.limit_usd:
                    raise BudgetExceeded(str(budget.budget_id), **{**figures, "reserved_usd": reserved})
            ids = [w["budget_id"] for w in rows]
            starts = [w["window_start"] for w in rows]
            made.execute(
                self._sql(_HOLD),
                {
                    "ids": ids,
                    "starts": starts,
                    "lapsed": [w["lapsed_usd"] for w in rows],
                    "now": now,
                    "estimate": estimate,
                    "reservation": reservation_id,
                    "expires": now + ttl,
                },
            )
        return Reservation(reservation_id, tuple(zip(ids, starts, strict=True)), estimate)

    def settle(
        self,
        tenant: str,
        reservation: Reservation,
        cost_usd: Decimal,
        at: datetime,
        *,
        held_only: bool = False,
    ) -> list[Raised]:
        """Turn the hold into the call's recorded cost, spent in the windows holding ``at`` (the
        moment the call's cost is recorded, which stamps its event); the alerts it newly
        crosses, once each.

        A hold that already lapsed (released by ``_expire``) still has its cost recorded; a
        budget removed meanwhile is skipped. With ``held_only`` the cost is recorded only while
        the hold is held: a settlement tried again after an error, which may have committed.
        """

        def attempt(again: bool) -> list[Raised]:
            # A try after a lost connection counts the cost only while the hold is held: the
            # one before may have committed and lost its reply.
            return self._settle(tenant, reservation, cost_usd, at, held_only=held_only or again)

        return self._pool.tried_again(attempt)

    def _settle(
        self, tenant: str, reservation: Reservation, cost_usd: Decimal, at: datetime, *, held_only: bool
    ) -> list[Raised]:
        ids = [budget_id for budget_id, _ in reservation.windows]
        starts = [start for _, start in reservation.windows]
        settled_in = {f"at_{period}": start for period, start in _starts(at).items()}
        # Two round trips, pipelined: (BEGIN, make the settled windows, lock them and the held
        # ones in budget-id order, settle), then the alerts' marks and COMMIT.
        with self._connection() as conn, conn.pipeline(), conn.transaction():
            locking, cursor = conn.cursor(), conn.cursor(row_factory=dict_row)
            locking.execute(_NO_FLUSH)
            locking.execute(self._sql(_MAKE_SETTLED_WINDOWS), {"ids": ids, **settled_in})
            locking.execute(self._sql(_LOCK_SETTLED), {"ids": ids, "starts": starts, **settled_in})
            cursor.execute(
                self._sql(_SETTLE),
                {
                    "ids": ids,
                    "starts": starts,
                    "cost": cost_usd,
                    "reservation": reservation.reservation_id,
                    "held": reservation.amount_usd,
                    "always": not held_only,
                    **settled_in,
                },
            )
            # A window the hold left and the cost did not go to (the day before) raises nothing.
            spent = [row for row in cursor.fetchall() if row["settled_here"]]
            return self._raise_alerts(cursor, tenant, spent)

    def spend_held(self, tenant: str, reservation_id: UUID) -> list[Raised]:
        """Take a hold whose call will never be settled by its worker as spent at its amount:
        the call's estimate, the most it could have cost. The alerts it newly crosses.

        For a worker lost mid-call (its step taken over): what its call cost is not known, so
        it counts at its estimate, not $0; its worker's settlement, should it come after all, adds
        only what its cost passes the estimate by. A hold that is gone (settled, released) spends nothing.
        """
        with self._connection() as conn, conn.transaction():
            cursor = conn.cursor(row_factory=dict_row)
            cursor.execute(_NO_FLUSH)
            held = cursor.execute(
                self._sql("SELECT budget_id, window_start FROM {holds} WHERE reservation_id = %s"),
                [reservation_id],
            ).fetchall()
            if not held:
                return []
            ids = [row["budget_id"] for row in held]
            starts = [row["window_start"] for row in held]
            self._lock_windows(cursor, ids, starts)
            rows = cursor.execute(self._sql(_SPEND_HELD), {"reservation": reservation_id}).fetchall()
            cursor.execute(self._sql(_SPENT_MARK), {"reservation": reservation_id})
            return self._raise_alerts(cursor, tenant, rows)

    def charge(self, scope: CallScope, cost_usd: Decimal, now: datetime, charge_id: UUID) -> list[Raised]:
        """Add the cost of a call made elsewhere (``record_step``) to the budgets it is charged to,
        in their windows holding ``now`` (when the call was recorded).

        Once per ``charge_id``: a repeated record (same step, same key) charges nothing.
        """
        # Tried again after a lost connection: the charge id makes a second try charge nothing.
        return self._pool.tried_again(lambda _again: self._charge(scope, cost_usd, now, charge_id))

    def _charge(self, scope: CallScope, cost_usd: Decimal, now: datetime, charge_id: UUID) -> list[Raised]:
        with self._connection() as conn, conn.transaction():
            cursor = conn.cursor(row_factory=dict_row)
            budgets = [_row(r) for r in cursor.execute(self._sql(_MATCHING), _params(scope)).fetchall()]
            if not budgets:
                return []
            fresh = cursor.execute(
                self._sql("INSERT INTO {charges} (charge_id) VALUES (%s) ON CONFLICT DO NOTHING"), [charge_id]
            )
            if fresh.rowcount != 1:
                return []
            ids = [b.budget_id for b in budgets]
            starts = [window_start(b.spec.period, now) for b in budgets]
            self._lock_windows(cursor, ids, starts)
            rows = cursor.execute(
                self._sql(
                    "UPDATE {windows} w SET spent_usd = w.spent_usd + %s"
                    " FROM unnest(%s::uuid[], %s::timestamptz[]) AS u(b, s)"
                    " WHERE w.budget_id = u.b AND w.window_start = u.s"
                    " RETURNING w.budget_id, w.window_start, w.spent_usd, w.alerted"
                ),
                [cost_usd, ids, starts],
            ).fetchall()
            return self._raise_alerts(cursor, scope.tenant, rows)

    def _lock_windows(self, cursor: Any, ids: list[UUID], starts: list[datetime]) -> None:
        """Make the windows' rows (when new) of the budgets still there, each budget locked
        against removal as a reservation locks it (``_MAKE_WINDOWS``), and lock the windows in
        budget-id order. A budget removed since its id was read (a stored step's charge, a lost
        worker's hold) is left out: its window failed the foreign key."""
        cursor.execute(
            self._sql(
                "INSERT INTO {windows} (budget_id, window_start)"
                " SELECT u.b, u.s FROM unnest(%(ids)s::uuid[], %(starts)s::timestamptz[]) AS u(b, s)"
                " WHERE u.b IN (SELECT budget_id FROM {budgets} WHERE budget_id = ANY(%(ids)s)"
                " FOR KEY SHARE) ON CONFLICT DO NOTHING"
            ),
            {"ids": ids, "starts": starts},
        )
        # The lock that serialises every reservation, settlement and charge of these windows.
        cursor.execute(
            self._sql(
                "SELECT 1 FROM {windows} w JOIN unnest(%s::uuid[], %s::timestamptz[]) AS u(b, s)"
                " ON w.budget_id = u.b AND w.window_start = u.s ORDER BY w.budget_id FOR UPDATE OF w"
            ),
            [ids, starts],
        )

    def _raise_alerts(self, cursor: Any, tenant: str, rows: list[dict[str, Any]]) -> list[Raised]:
        """The thresholds the updated windows newly reached (alert-mode budgets), marked as raised.

        ``rows`` carry the budget's terms (``_SETTLE``), or are looked up (``charge``).
        """
        raised: list[Raised] = []
        for window in rows:
            row = _row(window) if "limit_usd" in window else self._alerting(cursor, window["budget_id"])
            if row is None or row.spec.mode != "alert":
                continue
            if (damaged := _not_an_amount(row, window)) is not None:
                # An alert budget refuses nothing: its call stands, its thresholds cannot be told.
                _log.error(
                    "budget %s:%s per %s: its ledger holds %s = %s, not an amount (changed in the"
                    " database?); no alert is raised until the row is mended",
                    row.spec.scope,
                    row.spec.subject,
                    row.spec.period,
                    damaged["column"],
                    damaged["value"],
                )
                continue
            crossed = [
                t
                for t in THRESHOLDS
                if t not in window["alerted"] and window["spent_usd"] * 100 >= row.spec.limit_usd * t
            ]
            if not crossed:
                continue
            cursor.execute(
                self._sql(
                    "UPDATE {windows} SET alerted = alerted || %s::integer[]"
                    " WHERE budget_id = %s AND window_start = %s"
                ),
                [crossed, window["budget_id"], window["window_start"]],
            )
            raised.extend(
                Raised(
                    BudgetAlert(
                        tenant=tenant,
                        spec=row.spec,
                        budget_id=str(row.budget_id),
                        window_start=window["window_start"],
                        threshold=t,
                        spent_usd=window["spent_usd"],
                    ),
                    row.budget_id,
                    row.webhook_secret,
                )
                for t in crossed
            )
        return raised

    def _alerting(self, cursor: Any, budget_id: UUID) -> BudgetRow | None:
        """The budget's terms when it is in ``alert`` mode."""
        row = cursor.execute(
            self._sql(
                "SELECT budget_id, scope, subject, period, limit_usd, mode, webhook_url, webhook_secret"
                " FROM {budgets} WHERE budget_id = %s AND mode = 'alert'"
            ),
            [budget_id],
        ).fetchone()
        return None if row is None else _row(row)

    def open_reservations(self, budget_ids: Sequence[UUID] | None = None) -> int:
        """How many reservations are held (of some budgets, or of all): for tests and status."""
        with self._connection() as conn:
            row = conn.execute(
                self._sql(
                    "SELECT count(*) FROM {holds} WHERE %(ids)s::uuid[] IS NULL OR budget_id = ANY(%(ids)s)"
                ),
                {"ids": list(budget_ids) if budget_ids is not None else None},
            ).fetchone()
        return int(row[0]) if row else 0


def _starts(now: datetime) -> dict[str, datetime]:
    return {p: window_start(p, now) for p in ("day", "month", "total")}


def _params(scope: CallScope) -> dict[str, str | None]:
    return {
        "tenant": scope.tenant,
        "user": scope.user,
        "session": scope.session,
        "workflow": scope.workflow,
        "model": scope.model,
    }


def _not_an_amount(budget: BudgetRow, window: dict[str, Any]) -> dict[str, Any] | None:
    """The first of the budget's limit and its window's amounts that is not a finite number
    (``column`` and ``value``), or None. ``numeric`` takes ``NaN`` and ``Infinity``, and an edited
    row holding one raised ``decimal.InvalidOperation`` out of every call the budget covers
    (HTTP 500, the step failed as ``InvalidOperation``)."""
    amounts = {"limit_usd": budget.spec.limit_usd}
    amounts |= {c: window[c] for c in ("spent_usd", "reserved_usd", "lapsed_usd") if c in window}
    for column, value in amounts.items():
        if not Decimal(value).is_finite():
            return {"column": column, "value": value}
    return None


def _row(row: dict[str, Any]) -> BudgetRow:
    return BudgetRow(
        budget_id=row["budget_id"],
        spec=BudgetSpec(
            scope=row["scope"],
            subject=row["subject"],
            period=row["period"],
            limit_usd=row["limit_usd"],
            mode=row["mode"],
            webhook_url=row["webhook_url"],
        ),
        webhook_secret=row.get("webhook_secret"),
    )
