"""Cost dashboard queries over ``llm_calls``: totals, errors and exact latency percentiles by
any grouping and time window, and repricing recorded usage under other prices."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, localcontext
from typing import Any

from psycopg import Connection, sql

from flowledger.domain.errors import ValidationError
from flowledger.domain.pricing import (
    EXACT,
    LONG_CONTEXT_TOKENS,
    TOKEN_FIELDS,
    ModelPrice,
    TokenCounts,
    billed_key,
    cost_of,
    model_names,
)
from flowledger.projections.windows import require_window

GROUPINGS: Mapping[str, str] = {
    "model": "model",
    "provider": "provider",
    # A task's calls are filed under the workflow 'tasks' (cost.TASK_WORKFLOW): grouped by it,
    # they were counted in the sessions of a workflow named "tasks" (2 calls for 1).
    "workflow": "CASE WHEN source = 'session' THEN workflow END",
    # A task's calls are steps of the router (classification, escalation, skill_matching): as
    # plain text, a session step named "classification" was one group with every task's
    # classification (2 calls for 1). Marked with U+0001, which no step name may hold
    # (``require_name``), they are read back as a TaskStep (``group_of``). Not as JSON (a name
    # or an object): grouping 500,000 rows by it took 250-290 ms against 80-90 ms as text.
    "step": "CASE WHEN source = 'session' THEN step ELSE chr(1) || step END",
    "source": "source",
    # A fork beside its parent (Engine.fork_session). A task's calls carry its task id as their
    # subject: grouped by it, task "x1" was counted in session "x1"'s group (2 calls for 1).
    "session": "CASE WHEN source = 'session' THEN subject_id END",
    "minute": "date_trunc('minute', occurred_at, 'UTC')",
    "hour": "date_trunc('hour', occurred_at, 'UTC')",
    "day": "date_trunc('day', occurred_at, 'UTC')",
}
"""What a dashboard can be grouped by (time buckets are UTC). Calls that recorded no model or
provider, and a task's calls by session or workflow, are grouped under None, a value no name can
take: written as the text ``'(none)'``, they were one group with a model a provider or caller
named ``(none)``. By step, a task's calls are grouped under a ``TaskStep``, no session step's
name."""


@dataclass(frozen=True)
class TaskStep:
    """The step of a task's model calls as a dashboard group by ``step`` (``classification``,
    ``escalation``, ``skill_matching``): apart from a session step of the same name, which is
    grouped under its name (a ``str``). JSON writes it ``{"task_step": "classification"}``."""

    task_step: str


READS = ("auto", "raw", "rollups")
"""Where ``dashboard`` reads: ``raw`` rows (exact percentiles), the ``rollups``, or ``auto``:
raw rows for windows shorter than ``RAW_WINDOW``, roll-ups for longer ones."""
RAW_WINDOW = timedelta(hours=25)
"""Windows up to a day (the dashboards' default, ``--since 24h``) read raw rows, with exact
percentiles: a day of a busy tenant is a few hundred thousand rows, read in about a second."""


@dataclass(frozen=True)
class DashboardRow:
    """Calls, errors, tokens, cost and latency of one group; ``cost_usd`` is everything billed,
    split into ``succeeded_cost_usd``, ``retried_cost_usd`` and ``failed_cost_usd``, and the
    token counts are those of every attempt billed (``LlmUsage.billed_tokens``), retried ones
    included, as a session's totals count them."""

    group: tuple[Any, ...]
    calls: int
    errors: int
    errors_by_type: dict[str, int]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal
    latency_avg_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    succeeded_cost_usd: Decimal = Decimal(0)
    """What the answers of processed steps cost."""
    retried_cost_usd: Decimal = Decimal(0)
    """What the attempts retried before those answers were billed."""
    failed_cost_usd: Decimal = Decimal(0)
    """What the failed calls were billed (every attempt)."""
    unpriced_calls: int = 0
    """Calls whose cost is not known (no price, or billed for tokens not reported): ``cost_usd``
    leaves that out, so it is a lower bound."""
    cache_creation_tokens: int = 0
    audio_input_tokens: int = 0
    """The audio part of ``input_tokens`` (priced at the model's audio input rate)."""
    audio_output_tokens: int = 0
    """The audio part of ``output_tokens``."""


@dataclass(frozen=True)
class Price:
    """USD per token of each type, positionally; kept for callers of ``reprice`` that built
    prices this way. It is the domain's ``ModelPrice`` under other names."""

    input_per_token: Decimal
    output_per_token: Decimal
    cached_input_per_token: Decimal | None = None
    reasoning_output_per_token: Decimal | None = None

    def model_price(self) -> ModelPrice:
        """The same prices as a ``ModelPrice`` (validated there)."""
        return ModelPrice(
            input_cost_per_token=self.input_per_token,
            output_cost_per_token=self.output_per_token,
            cache_read_input_token_cost=self.cached_input_per_token,
            output_cost_per_reasoning_token=self.reasoning_output_per_token,
        )


@dataclass(frozen=True)
class RepriceRow:
    """Recorded cost of a group beside what the same usage costs under the given prices."""

    group: tuple[Any, ...]
    calls: int
    priced_calls: int
    recorded_cost_usd: Decimal
    repriced_cost_usd: Decimal

    @property
    def difference_usd(self) -> Decimal:
        """Repriced minus recorded, over the calls that had a price (negative is a saving)."""
        with localcontext(EXACT):  # not the thread's context: it may round
            return self.repriced_cost_usd - self.recorded_cost_usd


def _groups(by: Sequence[str]) -> list[sql.Composable]:
    unknown = [key for key in by if key not in GROUPINGS]
    if unknown:
        raise ValidationError("by", f"cannot group by {unknown}; choose from {sorted(GROUPINGS)}")
    if not by:
        return [sql.SQL("'all'::text AS g0")]
    return [sql.SQL(f"{GROUPINGS[key]} AS g{i}") for i, key in enumerate(by)]  # type: ignore[arg-type]


def _same(by: Sequence[str]) -> sql.Composable:
    """``totals`` and ``errors`` rows of the same group, a None (no model) matching a None."""
    return sql.SQL(" AND ").join(
        sql.SQL("totals.{key} IS NOT DISTINCT FROM errors.{key}").format(key=sql.Identifier(f"g{i}"))
        for i in range(max(len(by), 1))
    )


def _keys(count: int) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(f"g{i}") for i in range(max(count, 1)))


def dashboard(
    conn: Connection[Any],
    reader: str,
    *,
    tenant: str,
    since: datetime,
    until: datetime | None = None,
    by: Sequence[str] = ("model",),
    read: str = "auto",
) -> list[DashboardRow]:
    """Per group of ``tenant``'s calls with ``since <= occurred_at < until``: the dashboard
    numbers, costliest first.

    ``read`` (see ``READS``) picks raw rows or the roll-ups; both give the same calls, errors,
    tokens and cost, and the roll-ups' percentiles are within ``latency_sketch.RELATIVE_ERROR``.
    """
    _groups(by)
    require_window(since, until)
    # The roll-ups keep no session: grouped by session, the dashboard reads raw rows.
    if "session" not in by and _reads_rollups(read, since, until):
        # Imported here: that module builds on this one's DashboardRow and GROUPINGS.
        from flowledger.projections.cost_rollup_queries import rollup_dashboard

        return rollup_dashboard(conn, reader, tenant=tenant, since=since, until=until, by=by)
    keys = _keys(len(by))
    statement = sql.SQL("""
        WITH calls AS (
            -- Tokens of every attempt billed, as cost_usd counts every attempt (and a session's
            -- totals both): the answer's alone were shown beside the cost of all of them.
            SELECT {groups}, error_type, input_tokens + retried_input_tokens AS input_tokens,
                   output_tokens + retried_output_tokens AS output_tokens,
                   cache_read_input_tokens + retried_cache_read_input_tokens AS cache_read_input_tokens,
                   reasoning_output_tokens + retried_reasoning_output_tokens AS reasoning_output_tokens,
                   cost_usd + retried_cost_usd AS cost_usd, latency_ms,
                   cost_usd AS answer_usd, retried_cost_usd, unpriced,
                   cache_creation_input_tokens + retried_cache_creation_input_tokens
                       AS cache_creation_input_tokens,
                   audio_input_tokens + retried_audio_input_tokens AS audio_input_tokens,
                   audio_output_tokens + retried_audio_output_tokens AS audio_output_tokens
            FROM {reader}.llm_calls
            WHERE tenant = %(tenant)s
              AND occurred_at >= %(since)s AND (%(until)s::timestamptz IS NULL OR occurred_at < %(until)s)
        ), errors AS (
            SELECT {keys}, jsonb_object_agg(error_type, n) AS by_type
            FROM (SELECT {keys}, error_type, count(*) AS n FROM calls
                  WHERE error_type IS NOT NULL GROUP BY {keys}, error_type) AS e
            GROUP BY {keys}
        ), totals AS (
            SELECT {keys}, count(*), count(error_type), sum(input_tokens), sum(output_tokens),
                   sum(cache_read_input_tokens), sum(reasoning_output_tokens), sum(cost_usd),
                   -- numeric: a float sum overflowed on two stored latencies near 1e308
                   -- (past the input bound) and failed the whole dashboard
                   avg(latency_ms::numeric)::double precision,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms),
                   coalesce(sum(answer_usd) FILTER (WHERE error_type IS NULL), 0),
                   coalesce(sum(retried_cost_usd) FILTER (WHERE error_type IS NULL), 0),
                   coalesce(sum(cost_usd) FILTER (WHERE error_type IS NOT NULL), 0),
                   count(*) FILTER (WHERE unpriced), sum(cache_creation_input_tokens),
                   sum(audio_input_tokens), sum(audio_output_tokens)
            FROM calls GROUP BY {keys}
        )
        -- Joined once both are per group, and NULL to NULL: a group of calls with no model
        -- is None, and USING (a plain =) left its errors by type out.
        SELECT totals.*, errors.by_type::text FROM totals LEFT JOIN errors ON {same}
    """).format(
        groups=sql.SQL(", ").join(_groups(by)), reader=sql.Identifier(reader), keys=keys, same=_same(by)
    )
    rows = conn.execute(statement, {"tenant": tenant, "since": since, "until": until}).fetchall()
    width = max(len(by), 1)
    result = []
    for row in rows:
        n = row[width:]
        result.append(
            DashboardRow(
                group=group_of(row[:width], by),
                calls=n[0],
                errors=n[1],
                errors_by_type=_json_counts(n[18]),
                input_tokens=int(n[2]),
                output_tokens=int(n[3]),
                cached_tokens=int(n[4]),
                reasoning_tokens=int(n[5]),
                cost_usd=n[6],
                latency_avg_ms=n[7],
                latency_p50_ms=n[8],
                latency_p95_ms=n[9],
                latency_p99_ms=n[10],
                succeeded_cost_usd=n[11],
                retried_cost_usd=n[12],
                failed_cost_usd=n[13],
                unpriced_calls=n[14],
                cache_creation_tokens=int(n[15]),
                audio_input_tokens=int(n[16]),
                audio_output_tokens=int(n[17]),
            )
        )
    return costliest_first(result)


def costliest_first(rows: list[DashboardRow]) -> list[DashboardRow]:
    """Dashboard rows by cost, highest first, then by group with names by code point: raw rows
    and roll-ups in one order (ORDER BY in SQL broke ties by the database's collation, 'a'
    before 'B' under en-US, where the roll-ups put 'B' first)."""
    # Two stable sorts, not a key of -cost: negating a Decimal rounds it to the thread's context.
    by_group = sorted(rows, key=lambda r: tuple(_rank(key) for key in r.group))
    return sorted(by_group, key=lambda r: r.cost_usd, reverse=True)


def _rank(key: Any) -> tuple[int, Any]:
    # A group holding None (no model) sorts before every name and a task's step after them:
    # None, a str and a TaskStep do not compare.
    if key is None:
        return (0, "")
    if isinstance(key, TaskStep):
        return (2, key.task_step)
    return (1, key)


def group_of(values: Sequence[Any], by: Sequence[str]) -> tuple[Any, ...]:
    """A row's group (grouped ``by``) as the database gave it, in Python's values: time buckets
    in UTC, and a step as its name (a session's) or a ``TaskStep`` (a task's)."""
    steps = {i for i, key in enumerate(by) if key == "step"}  # by () is one group, 'all'
    return tuple(_step_of(value) if i in steps else value for i, value in enumerate(in_utc(values)))


_TASK_STEP_MARK = "\x01"
"""What GROUPINGS["step"] puts before a task's step: a control character, in no step's name."""


def _step_of(value: Any) -> Any:
    # The step grouping (GROUPINGS["step"]): a session step's name, or a task's, marked.
    if isinstance(value, str) and value.startswith(_TASK_STEP_MARK):
        return TaskStep(value[1:])
    return value


def in_utc(group: Sequence[Any]) -> tuple[Any, ...]:
    """A row's group with its time buckets in UTC: they are UTC minutes, hours and days, but
    psycopg gives a timestamptz in the connection's TimeZone (a server's default, or PGTZ), and
    an hour came back as 06:30+05:30."""
    return tuple(key.astimezone(UTC) if isinstance(key, datetime) else key for key in group)


def read_for(window: timedelta | None, *, exact: bool = False) -> str:
    """The ``read`` for a window ``window`` long measured on the engine's clock (the CLI's and
    the HTTP API's ``since``): raw rows when ``exact`` or shorter than ``RAW_WINDOW``, else
    ``auto``. Left to ``auto``, a window was judged from this host's clock: 2 hours ahead of
    the database's, a ``24h`` dashboard read the roll-ups (a p50 of 298.06 ms for 300)."""
    if exact or (window is not None and window < RAW_WINDOW):
        return "raw"
    return "auto"


def _reads_rollups(read: str, since: datetime, until: datetime | None) -> bool:
    if read not in READS:
        raise ValidationError("read", f"must be one of {list(READS)}, not {read!r}")
    if read != "auto":
        return read == "rollups"
    end = until if until is not None else datetime.now(UTC)
    return end - since >= RAW_WINDOW


def _json_counts(text: str | None) -> dict[str, int]:
    return {} if text is None else {k: int(v) for k, v in json.loads(text).items()}


def reprice(
    conn: Connection[Any],
    reader: str,
    prices: Mapping[str, ModelPrice | Price],
    *,
    tenant: str,
    as_model: str | None = None,
    since: datetime,
    until: datetime | None = None,
    by: Sequence[str] = ("model",),
) -> list[RepriceRow]:
    """What ``tenant``'s recorded usage would have cost: each call at its own model's price in
    ``prices``, or every call at ``as_model``'s price. Calls without a price are counted but
    not priced, and so are unpriced calls (their recorded cost is not known: comparing a price
    with it would count it as $0).

    The database sums tokens per group and model; the domain's ``cost_of`` prices the sums
    (the rule is linear), so no second pricing formula lives in SQL.
    """
    require_window(since, until)
    table = {model: _model_price(price) for model, price in prices.items()}
    if as_model is not None and as_model not in table:
        raise ValidationError("as_model", f"no price for {as_model!r}; have {sorted(table)}")
    statement = sql.SQL("""
        WITH calls AS (
            SELECT {groups}, c.request_model AS priced_request_model, c.model AS priced_model,
                   c.input_tokens > %(long)s AS long_context, c.unpriced,
                   c.input_tokens, c.output_tokens, c.cache_read_input_tokens,
                   c.reasoning_output_tokens, c.cache_creation_input_tokens,
                   c.cache_creation_1h_input_tokens, c.audio_input_tokens, c.audio_output_tokens,
                   c.cost_usd
            FROM {reader}.llm_calls AS c
            WHERE c.tenant = %(tenant)s
              AND occurred_at >= %(since)s AND (%(until)s::timestamptz IS NULL OR occurred_at < %(until)s)
        )
        SELECT {keys}, priced_request_model, priced_model, long_context, unpriced, count(*),
               coalesce(sum(cost_usd), 0), sum(input_tokens), sum(output_tokens),
               sum(cache_read_input_tokens), sum(reasoning_output_tokens),
               sum(cache_creation_input_tokens), sum(cache_creation_1h_input_tokens),
               sum(audio_input_tokens), sum(audio_output_tokens)
        FROM calls GROUP BY {keys}, priced_request_model, priced_model, long_context, unpriced
        ORDER BY {keys}
    """).format(groups=sql.SQL(", ").join(_groups(by)), reader=sql.Identifier(reader), keys=_keys(len(by)))
    width = max(len(by), 1)
    totals: dict[tuple[Any, ...], list[Any]] = {}
    params = {"tenant": tenant, "since": since, "until": until, "long": LONG_CONTEXT_TOKENS}
    for row in conn.execute(statement, params).fetchall():
        group = group_of(row[:width], by)
        request_model, model, long_context, unpriced, calls, recorded, *sums = row[width:]
        total = totals.setdefault(group, [0, 0, Decimal(0), Decimal(0)])
        total[0] += calls
        price = _price_of(table, as_model, request_model, model)
        if price is None or unpriced:
            continue
        total[1] += calls
        with localcontext(EXACT):  # money: the thread's context rounds (28 digits, or fewer)
            total[2] += recorded
            total[3] += _cost_of_sums(price, [int(n) for n in sums], bool(long_context))
    return [RepriceRow(group, *total) for group, total in totals.items()]


def _cost_of_sums(price: ModelPrice, sums: list[int], long_context: bool) -> Decimal:
    """The cost of summed counts of calls all on one side of the long-context threshold (the
    rule is linear within a tier; the tier is each call's, not the sum's)."""
    counts = TokenCounts(**dict(zip(TOKEN_FIELDS, sums, strict=True)))
    return cost_of(counts, price, long_context=long_context)


def _model_price(price: ModelPrice | Price) -> ModelPrice:
    return price if isinstance(price, ModelPrice) else price.model_price()


def _price_of(
    table: Mapping[str, ModelPrice], as_model: str | None, request_model: str | None, model: str | None
) -> ModelPrice | None:
    # The what-if model when one is asked for, else the entry the adapter charges
    # (``billed_key``), each name also without a ``provider/`` prefix or a release date.
    if as_model is not None:
        return table[as_model]

    def entry(name: str) -> str | None:
        return next((candidate for candidate in model_names(name) if candidate in table), None)

    key = billed_key(entry, request_model, model)
    return None if key is None else table[key]
