"""The Budget aggregate: a spending limit in USD on one scope of model calls, per window.

A budget limits the cost of the calls of a tenant, a user, a session, a workflow or a
model, per UTC day, per UTC month, or in total. In ``enforce`` mode a call that could
take the window past the limit is refused before it is made; in ``alert`` mode calls go
on and the budget raises an alert the first time the window's spend reaches 50, 80 and
100 % of the limit. The arithmetic of the ledger (reservations, settling) lives with the
ledger; this module holds the rules a budget is defined by and its events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit, urlunsplit
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import event

from flowledger.domain.aggregate import FlowledgerAggregate
from flowledger.domain.bounds import require_tenant, shown
from flowledger.domain.errors import ValidationError
from flowledger.domain.values import require_id, require_name

SCOPES = ("tenant", "user", "session", "workflow", "model")
PERIODS = ("day", "month", "total")
MODES = ("enforce", "alert")
THRESHOLDS = (50, 80, 100)
"""Percentages of the limit at which an alert is raised, once each per window."""
MAX_LIMIT_USD = Decimal("1000000000")
MAX_DECIMALS = 12
TOTAL_WINDOW = datetime(1970, 1, 1, tzinfo=UTC)
"""The one window of a ``total`` budget."""

BUDGET_NAMESPACE = uuid5(NAMESPACE_URL, "https://flowledger.dev/budget")


def budget_uuid(tenant: str, scope: str, subject: str, period: str) -> UUID:
    """The aggregate id of a tenant's budget on ``scope``/``subject`` per ``period``."""
    return uuid5(BUDGET_NAMESPACE, f"{tenant}\x1f{scope}\x1f{subject}\x1f{period}")


_PLAIN_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")
"""How a limit is written as text: ASCII digits, an optional fraction (a sign only to be refused
as not more than 0); no exponent, underscore or space."""


def require_limit(value: object) -> Decimal:
    """A positive, finite amount of USD with at most 12 decimals (floats refused: not exact)."""
    if isinstance(value, bool | float):
        message = f"must be an exact decimal (a string or Decimal), got {shown(value)}"
        raise ValidationError("limit_usd", message)
    if isinstance(value, str) and _PLAIN_DECIMAL.fullmatch(value) is None:
        # Decimal itself also reads "1_000", " 5 ", "1e3" and non-ASCII digits
        raise ValidationError("limit_usd", f"must be a plain decimal like 25 or 0.50, got {value[:40]!r}")
    try:
        amount = Decimal(value) if isinstance(value, str | int) else value
    except InvalidOperation:
        raise ValidationError("limit_usd", f"must be a decimal amount of USD, got {shown(value)}") from None
    if not isinstance(amount, Decimal) or not amount.is_finite():
        raise ValidationError("limit_usd", f"must be a decimal amount of USD, got {shown(value)}")
    # Said as written (``format(..., "f")``): 0.0000000000001 was answered "got 1E-13", and a JSON
    # number rounded to nothing "got 0E-12".
    if not Decimal(0) < amount <= MAX_LIMIT_USD:
        raise ValidationError("limit_usd", f"must be more than 0 and at most {MAX_LIMIT_USD}, got {amount:f}")
    exponent = amount.normalize().as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MAX_DECIMALS:
        raise ValidationError("limit_usd", f"must have at most {MAX_DECIMALS} decimals, got {amount:f}")
    return amount


def require_webhook_url(url: str | None) -> str | None:
    """None, or an absolute http(s) URL of at most 2,000 characters with a host, a valid port
    if any, and no whitespace or control character anywhere."""
    if url is None:
        return None
    if not isinstance(url, str) or len(url) > 2000 or any(c.isspace() or not c.isprintable() for c in url):
        raise ValidationError("webhook_url", f"must be an absolute http(s) URL, got {shown(url)}")
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # not a number, or past 65535
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValidationError(
            "webhook_url",
            f"must be an absolute http(s) URL with a host (and a port of 1-65535), got {shown(url)}",
        )
    return url


def listed_url(url: str | None, *, path: bool = True) -> str | None:
    """A webhook's URL as listed and logged: credentials in it (``user:password@``) masked as
    ``***``. Readers list budgets, the admin who set one need not see it again (the webhook
    secret is never listed either), and logs travel further than either; the URL as set is
    what the alerts are sent to. Without ``path`` (to a key that may not set budgets), the path
    and query go too, as ``/***``: a capability URL's path is its secret (Slack's, Teams' and
    Discord's incoming webhooks), with which anyone may post to the tenant's channel."""
    if url is None:
        return None
    parts = urlsplit(url)
    if not path and (parts.path not in ("", "/") or parts.query or parts.fragment):
        parts = parts._replace(path="/***", query="", fragment="")
    if "@" not in parts.netloc:
        return urlunsplit(parts)
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def require_subject(scope: str, subject: object) -> str:
    """The subject of a ``scope`` budget, as that scope's ids are written: a name
    (``require_name``) that is not only dots (REST addresses a budget in its URL path, where
    clients resolve ``.`` and ``..`` away) and, for ``session``, a session id (``require_id``:
    no ``/`` either), since a budget naming anything else would never meet a session; for
    ``model``, no space around it, as a step's model has none. Model,
    workflow and user names may hold ``/`` (LiteLLM's price table names
    ``openrouter/deepseek/deepseek-v3.2``)."""
    name = require_name("subject", subject)
    if not name.replace(".", "").strip():
        raise ValidationError(
            "subject", "must not be only dots: URL paths address the budget ('.' and '..' vanish)"
        )
    if scope == "model" and name != name.strip():
        # A step's model has no space around it (``bounds.require_model``): a budget on
        # " gpt-4.1" was set, shown, and never charged a cent, its calls running unbounded.
        raise ValidationError(
            "subject",
            f"a model has no space around its name: no call could be charged to {name[:60]!r}",
        )
    if scope == "session":
        try:
            require_id("subject", name, unlike_others=False)  # it may name a session stored before
        except ValidationError:
            raise ValidationError(
                "subject",
                f"must be a session id, which holds no '/' and is not only dots: no session could be"
                f" charged to {name[:60]!r}",
            ) from None
    return name


def window_start(period: str, now: datetime) -> datetime:
    """The start of the window of ``period`` that holds ``now`` (UTC days and months)."""
    at = now.astimezone(UTC)
    if period == "day":
        return at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if period == "total":
        return TOTAL_WINDOW
    raise ValidationError("period", f"{shown(period)} is not one of {', '.join(PERIODS)}")


@dataclass(frozen=True, kw_only=True)
class CallScope:
    """What a model call is charged to: one subject per scope (None: the call has none, as a
    task's classification or ranking call has no session, workflow or user)."""

    tenant: str
    session: str | None
    workflow: str | None
    model: str
    user: str | None = None

    def subject(self, scope: str) -> str | None:
        """The call's subject in ``scope`` (e.g. its user id for ``user``)."""
        return {
            "tenant": self.tenant,
            "user": self.user,
            "session": self.session,
            "workflow": self.workflow,
            "model": self.model,
        }[scope]


@dataclass(frozen=True, kw_only=True)
class BudgetSpec:
    """What a budget is: its scope and subject, period, limit, mode and optional webhook."""

    scope: str
    subject: str
    period: str
    limit_usd: Decimal
    mode: str = "enforce"
    webhook_url: str | None = None

    @classmethod
    def of(
        cls,
        *,
        scope: str,
        subject: str,
        period: str,
        limit_usd: object,
        mode: str = "enforce",
        webhook_url: str | None = None,
    ) -> BudgetSpec:
        """A checked spec; ValidationError names the first bad field."""
        if scope not in SCOPES:
            raise ValidationError("scope", f"{shown(scope)} is not one of {', '.join(SCOPES)}")
        if period not in PERIODS:
            raise ValidationError("period", f"{shown(period)} is not one of {', '.join(PERIODS)}")
        if mode not in MODES:
            raise ValidationError("mode", f"{shown(mode)} is not one of {', '.join(MODES)}")
        require_subject(scope, subject)
        return cls(
            scope=scope,
            subject=subject,
            period=period,
            limit_usd=require_limit(limit_usd),
            mode=mode,
            webhook_url=require_webhook_url(webhook_url),
        )


@dataclass(frozen=True, kw_only=True)
class BudgetAlert:
    """A threshold of a budget's limit reached in one window."""

    tenant: str
    spec: BudgetSpec
    budget_id: str
    window_start: datetime
    threshold: int
    spent_usd: Decimal


class Budget(FlowledgerAggregate):
    """A tenant's budget: its current spec, whether it is removed, and the alerts it raised."""

    class Defined(FlowledgerAggregate.Created):
        """The budget was set for the first time."""

        class_version = 1
        tenant: str
        scope: str
        subject: str
        period: str
        limit_usd: Decimal
        mode: str
        webhook_url: str | None

    class Changed(FlowledgerAggregate.Event):
        """The budget was set again with another limit, mode or webhook (or after removal)."""

        class_version = 1
        limit_usd: Decimal
        mode: str
        webhook_url: str | None

        def apply(self, aggregate: Budget) -> None:
            """Take the new terms; a removed budget is active again. Under another limit the
            window's alerts are forgotten: the ledger, which knows the spend, decides which
            thresholds of the new limit are still to raise (``PostgresBudgetLedger.put``)."""
            if self.limit_usd != aggregate.limit_usd:
                aggregate.alerted_window, aggregate.alerted = None, ()
            aggregate.limit_usd, aggregate.mode = self.limit_usd, self.mode
            aggregate.webhook_url, aggregate.removed = self.webhook_url, False

    class Removed(FlowledgerAggregate.Event):
        """The budget no longer applies."""

        class_version = 1

        def apply(self, aggregate: Budget) -> None:
            """Mark it removed, and forget its alerts: its windows go with it, so set again it
            starts from zero and raises each threshold anew (kept, the alerts the ledger raised
            again were refused here while their webhooks went out unrecorded)."""
            aggregate.removed = True
            aggregate.alerted_window, aggregate.alerted = None, ()

    class AlertRaised(FlowledgerAggregate.Event):
        """The window's recorded spend reached ``threshold`` % of the limit."""

        class_version = 1
        window_start: datetime
        threshold: int
        spent_usd: Decimal
        limit_usd: Decimal

        def apply(self, aggregate: Budget) -> None:
            """Remember the threshold for this window (earlier windows are forgotten)."""
            kept = aggregate.alerted if aggregate.alerted_window == self.window_start else ()
            aggregate.alerted_window = self.window_start
            aggregate.alerted = (*kept, self.threshold)

    @staticmethod
    def create_id(tenant: str, scope: str, subject: str, period: str) -> UUID:
        """Budgets are addressed by what they limit; no lookup table."""
        return budget_uuid(tenant, scope, subject, period)

    @classmethod
    def define(cls, tenant: str, spec: BudgetSpec) -> Budget:
        """A new budget with a checked spec."""
        require_tenant(tenant)
        return cls(
            tenant=tenant,
            scope=spec.scope,
            subject=spec.subject,
            period=spec.period,
            limit_usd=spec.limit_usd,
            mode=spec.mode,
            webhook_url=spec.webhook_url,
        )

    @event(Defined)
    def __init__(
        self,
        *,
        tenant: str,
        scope: str,
        subject: str,
        period: str,
        limit_usd: Decimal,
        mode: str,
        webhook_url: str | None,
    ) -> None:
        self.tenant, self.scope, self.subject, self.period = tenant, scope, subject, period
        self.limit_usd, self.mode, self.webhook_url = limit_usd, mode, webhook_url
        self.removed = False
        self.alerted_window: datetime | None = None
        self.alerted: tuple[int, ...] = ()

    @property
    def spec(self) -> BudgetSpec:
        """The budget's current terms."""
        return BudgetSpec(
            scope=self.scope,
            subject=self.subject,
            period=self.period,
            limit_usd=self.limit_usd,
            mode=self.mode,
            webhook_url=self.webhook_url,
        )

    def change(self, spec: BudgetSpec) -> bool:
        """Take new terms; False (no event) when they are the budget's current ones."""
        if not self.removed and spec == self.spec:
            return False
        self.trigger_event(
            self.Changed, limit_usd=spec.limit_usd, mode=spec.mode, webhook_url=spec.webhook_url
        )
        return True

    def remove(self) -> bool:
        """Stop applying; False (no event) when already removed."""
        if self.removed:
            return False
        self.trigger_event(self.Removed)
        return True

    def raise_alert(self, window: datetime, threshold: int, spent_usd: Decimal) -> bool:
        """Record a threshold reached; False (no event) when already raised in this window."""
        if threshold not in THRESHOLDS:
            raise ValidationError("threshold", f"must be one of {THRESHOLDS}, got {shown(threshold)}")
        if self.alerted_window == window and threshold in self.alerted:
            return False
        self.trigger_event(
            self.AlertRaised,
            window_start=window,
            threshold=threshold,
            spent_usd=spent_usd,
            limit_usd=self.limit_usd,
        )
        return True
