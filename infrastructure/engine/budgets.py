"""Budget use cases: set, list and remove budgets; reserve and settle a model call's cost.

Setting or removing a budget appends the Budget aggregate's event, then writes its terms
to the ledger table (a retry of the same command repairs a ledger write that failed
after the event). ``reserve`` and ``settle`` are blocking (run them on a database thread);
the alerts ``settle`` decides are appended as ``Budget.AlertRaised`` and handed to the
``AlertNotifier`` by ``notify``, on the caller's event loop, without waiting for delivery.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, localcontext
from functools import partial
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid4, uuid5

from flowledger.domain.budget import (
    PERIODS,
    SCOPES,
    Budget,
    BudgetSpec,
    CallScope,
    budget_uuid,
    window_start,
)
from flowledger.domain.errors import BudgetNotFound, StoreUnavailable, ValidationError
from flowledger.domain.ports import AlertNotifier, CallEstimate
from flowledger.domain.pricing import EXACT
from flowledger.domain.values import LlmUsage, require_name
from flowledger.infrastructure.engine.later_charges import LaterCharges
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.postgres.budgets import Burn, PostgresBudgetLedger, Raised, Reservation

RESERVATION_TTL_S = 600.0
"""How long a hold outlives a worker that died mid-call (a live call settles long before)."""
NO_BUDGETS_CACHE_S = 1.0
"""A tenant seen without budgets is not asked again for this long: steps pay no query then.
The answer is a lease in the ledger (``postgres/budget_leases.py``): a budget set by another
process waits out the leases of the others before ``set`` returns, so it holds for every call
made after; one set here holds at once."""
BUDGETS_SEEN_CACHE_S = 1.0
"""A tenant seen with budgets is not asked again for this long either (``active`` only
decides whether a recorded step's cost is charged; the charge finds the budgets itself)."""
STEP_HOLD_NAMESPACE = uuid5(NAMESPACE_URL, "https://flowledger.dev/step-hold")
CHARGE_RETRY_S = 120.0
"""How long the charge of a stored step is tried again, in the background, while the ledger is away."""

_log = logging.getLogger(__name__)


def call_cost(usage: LlmUsage | None, hold: Reservation) -> Decimal:
    """What a call settles: its usage's ``charged_usd`` (retried attempts were billed too; $0
    without usage), and, when its cost is not known (``unpriced``: no price, no usage in the
    reply, a reply or stream lost before its usage), what it held for each attempt billed for
    what is not known, so a provider (or a proxy) that leaves usage out cannot spend past an
    enforced budget. The hold is the most one attempt can cost: counted once for the call, a
    stream cut three times (three attempts the provider billed) counted as one."""
    cost = usage.charged_usd if usage is not None else Decimal(0)
    if usage is not None and usage.unpriced:
        with localcontext(EXACT):
            cost = cost + hold.amount_usd * attempts_of_unknown_cost(usage)
    return cost


def attempts_of_unknown_cost(usage: LlmUsage) -> int:
    """How many of an ``unpriced`` call's attempts were billed for what is not known, by its
    attempt log (``adapters/llm/usage.py``): an entry priced at ``cost_usd: null`` (usage not
    reported or not readable, or no price), or an answer (``ok``) that carried no usage. At
    least 1: an adapter that keeps no log, or one whose entries say nothing of cost."""
    log = usage.extra.get("attempt_log")
    entries = [entry for entry in log if isinstance(entry, dict)] if isinstance(log, list) else []
    unknown = sum(
        1
        for entry in entries
        if ("cost_usd" in entry and entry["cost_usd"] is None)
        or (entry.get("outcome") == "ok" and "usage" not in entry)
    )
    return max(unknown, 1)


def held_estimate(llm: object, model: str | None, messages: list[dict[str, Any]]) -> tuple[str, Decimal]:
    """The model a call is charged as (the price table's name) and the amount held before it:
    the adapter's estimated maximum (``max_cost``), or $0 for an adapter that cannot estimate
    (its calls are still refused once a budget is spent, but concurrent ones may overshoot)."""
    estimator = getattr(llm, "max_cost", None)
    estimate: CallEstimate | None = estimator(model, messages) if estimator is not None else None
    if estimate is None:
        return model or "", Decimal(0)
    return estimate.model, estimate.max_cost_usd


def recorded_model(llm: object, usage: LlmUsage) -> str:
    """The model a call made elsewhere (``record_step``) is charged as: the one it asked for
    (the one that answered when it names none), under the adapter's one name for it
    (``ModelNames.model_key``: alias, provider prefix, release date resolved), as a call
    ``process_step`` makes is charged. Charged by the reply's name, a call OpenAI answered as
    ``gpt-4.1-2025-04-14`` missed the budget on ``gpt-4.1``."""
    model = usage.request_model or usage.response_model
    names = getattr(llm, "model_key", None)
    return names(model) if names is not None and model else model


def step_hold_id(session: UUID, key: str, worker: str, started_at: datetime) -> UUID:
    """The reservation id of one attempt at a step (its session's aggregate id, key, worker and
    start): a worker that takes the step over finds the hold of the attempt it abandons."""
    return uuid5(STEP_HOLD_NAMESPACE, f"{session}\x1f{key}\x1f{worker}\x1f{started_at.isoformat()}")


@dataclass(frozen=True, kw_only=True)
class BudgetSet:
    """The budget as set, and its webhook secret when one was made for it (shown once)."""

    budget_id: str
    spec: BudgetSpec
    changed: bool
    webhook_secret: str | None = None


class BudgetService:
    """One tenant's budgets over the store (events) and the ledger (windows, reservations)."""

    def __init__(
        self,
        store: AggregateStore,
        ledger: PostgresBudgetLedger | None,
        tenant: str,
        notifier: AlertNotifier | None = None,
        *,
        reservation_ttl_s: float = RESERVATION_TTL_S,
        ensure_open: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._ensure_open = ensure_open
        """EngineClosed once its engine is closed (a tenant's engine closes before the store);
        None: once the store is."""
        self._ledger = ledger
        self._tenant = tenant
        self.notifier = notifier
        self.reservation_ttl_s = reservation_ttl_s
        self._none_until = 0.0
        self._some_until = 0.0
        self._asking = threading.Lock()
        self._holder = uuid4()
        """This service's name on its leases (``NO_BUDGETS_CACHE_S``)."""
        self._sets = 0
        """Budgets set here: an answer of none asked before one of them is not kept."""
        self.later = LaterCharges(CHARGE_RETRY_S)
        """Charges of stored steps waiting for the ledger."""
        self.charged_as: Callable[[str], str] | None = None
        """The name calls to a model are charged as (the LLM adapter's ``model_key``: the price
        table's name), which a model budget must be set on to hold; None: not known here."""

    @property
    def tenant(self) -> str:
        """The tenant whose budgets these are."""
        return self._tenant

    def _require_ledger(self) -> PostgresBudgetLedger:
        ensure_open = self._store.app.ensure_open if self._ensure_open is None else self._ensure_open
        ensure_open("read budgets")
        if self._ledger is None:
            raise ValidationError(
                "database_url", "budgets need PostgreSQL (this engine keeps events in memory)"
            )
        return self._ledger

    def close(self) -> None:
        """Close the ledger's connections."""
        if self._ledger is not None:
            self._ledger.close()

    # -- commands ----------------------------------------------------------------------

    def set(
        self,
        scope: str,
        subject: str | None,
        period: str,
        limit_usd: object,
        *,
        mode: str = "enforce",
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
    ) -> BudgetSet:
        """Set (or change) a budget; for ``tenant`` the subject is this tenant (and may be omitted)."""
        ledger = self._require_ledger()
        spec = BudgetSpec.of(
            scope=scope,
            subject=self._subject(scope, subject),
            period=period,
            limit_usd=limit_usd,
            mode=mode,
            webhook_url=webhook_url,
        )
        self._require_charged_name(spec)
        if webhook_secret is not None and (webhook_url is None or not 16 <= len(webhook_secret) <= 200):
            raise ValidationError("webhook_secret", "needs a webhook_url and 16 to 200 characters")
        made = None
        if webhook_url is not None and webhook_secret is None:
            known = ledger.find(self.budget_id(spec))
            webhook_secret = known.webhook_secret if known is not None else None
            if webhook_secret is None:
                webhook_secret = made = secrets.token_urlsafe(32)
        budget_id = self.budget_id(spec)
        changed = self._store.write(f"budget:{budget_id}", partial(self._define, budget_id, spec))
        leased_s = ledger.put(
            self._tenant,
            budget_id,
            spec,
            webhook_secret,
            latest=partial(self._latest, budget_id),
            holder=self._holder,
        )
        self._sets += 1
        self._none_until = 0.0
        if leased_s > 0:
            # Another engine saw the tenant without budgets just before, and skips reservations
            # until its lease ends: the budget holds for its calls only from then.
            time.sleep(leased_s)
        return BudgetSet(budget_id=str(budget_id), spec=spec, changed=changed, webhook_secret=made)

    def _require_charged_name(self, spec: BudgetSpec) -> None:
        """Refuse a model budget on a name no call is charged as: calls to ``openai/gpt-4.1``,
        ``gpt-4.1-2025-04-14`` or an alias are charged as ``gpt-4.1``, so an enforced budget set
        on one of those other names was accepted and never refused a call."""
        if spec.scope != "model" or self.charged_as is None:
            return
        charged = self.charged_as(spec.subject)
        if charged != spec.subject:
            raise ValidationError(
                "subject",
                f"calls to {spec.subject!r} are charged as {charged!r}, the price table's name for it:"
                f" a budget on {spec.subject!r} would never hold; set it on {charged!r}",
            )

    def remove(self, scope: str, subject: str | None, period: str) -> str:
        """Remove a budget (its windows' spend goes with it); BudgetNotFound when none is set."""
        ledger = self._require_ledger()
        subject = self._subject(scope, subject)
        refused = None
        try:
            spec = BudgetSpec.of(scope=scope, subject=subject, period=period, limit_usd=1)
        except ValidationError as error:
            if error.field != "subject" or scope not in SCOPES or period not in PERIODS:
                raise
            # Set before subjects were checked by scope (``session a/b``, ``user ..``): still removable.
            refused = error
            spec = BudgetSpec(
                scope=scope, subject=require_name("subject", subject), period=period, limit_usd=Decimal(1)
            )
        budget_id = self.budget_id(spec)
        removed = self._store.write(f"budget:{budget_id}", partial(self._remove, budget_id))
        deleted = ledger.delete(budget_id, latest=partial(self._latest, budget_id))
        self._some_until = 0.0
        if not (removed or deleted):
            raise refused or BudgetNotFound(f"{spec.scope}:{spec.subject}/{spec.period}")
        return str(budget_id)

    def burn(self) -> list[Burn]:
        """The tenant's budgets with their current window's burn."""
        return self._require_ledger().burn(self._tenant, self._store.clock())

    def burn_as_set(self, made: BudgetSet) -> Burn:
        """The burn of the budget ``set`` just made: its current window's, or, when another
        request removed it since (its windows went with it), its terms as set with nothing
        spent or held. Looked up by id in ``burn``, a removal between the two raised
        StopIteration out of ``PUT /v1/budgets/...``: a 500 for a budget that had been set."""
        found = next((burn for burn in self.burn() if str(burn.budget_id) == made.budget_id), None)
        if found is not None:
            return found
        return Burn(
            budget_id=UUID(made.budget_id),
            spec=made.spec,
            window_start=window_start(made.spec.period, self._store.clock()),
            spent_usd=Decimal(0),
            reserved_usd=Decimal(0),
        )

    def budget_id(self, spec: BudgetSpec) -> UUID:
        """The aggregate (and ledger) id of a budget in this tenant."""
        return budget_uuid(self._tenant, spec.scope, spec.subject, spec.period)

    def _subject(self, scope: str, subject: str | None) -> str:
        if scope != "tenant":
            if subject is None:
                raise ValidationError("subject", f"a {scope} budget needs the {scope}'s id")
            return subject
        if subject is not None and subject != self._tenant:
            raise ValidationError("subject", f"a tenant budget is on this tenant ({self._tenant!r}) only")
        return self._tenant

    def _latest(self, budget_id: UUID) -> BudgetSpec | None:
        """The budget's terms as its events last recorded them (None: removed, or never set):
        what the ledger row is written from, so the slower of two processes' writes cannot put
        older terms back."""
        budget: Budget | None = self._store.load(budget_id)
        return None if budget is None or budget.removed else budget.spec

    def _define(self, budget_id: UUID, spec: BudgetSpec, uow: UnitOfWork) -> bool:
        budget: Budget | None = uow.find(budget_id)
        if budget is None:
            uow.add(Budget.define(self._tenant, spec))
            return True
        return budget.change(spec)

    def _remove(self, budget_id: UUID, uow: UnitOfWork) -> bool:
        budget: Budget | None = uow.find(budget_id)
        return budget is not None and budget.remove()

    # -- the step path (blocking: run on a database thread) ----------------------------

    def known_idle(self) -> bool:
        """Whether the tenant is known to have no budgets now (nothing to ask the database):
        a step then skips its reservation, and the thread hop and cost estimate it took."""
        return self._ledger is None or time.monotonic() < self._none_until

    def active(self) -> bool:
        """Whether the tenant may have budgets (the ledger is asked at most once a second).

        One writer asks at a time; writers that came while it asked take its answer (eight
        writers used to send eight queries, each growing the ledger's pool, every second).
        """
        if self._ledger is None:
            return False
        now = time.monotonic()
        if now < self._none_until:
            return False
        if now < self._some_until:
            return True
        with self._asking:
            now = time.monotonic()
            if now < self._none_until:
                return False
            if now < self._some_until:
                return True
            sets, asked = self._sets, time.monotonic()
            if self._ledger.has_budgets(self._tenant, holder=self._holder, lease_s=NO_BUDGETS_CACHE_S):
                self._some_until = time.monotonic() + BUDGETS_SEEN_CACHE_S
                return True
            if sets != self._sets:  # a budget was set here meanwhile: the answer may be stale
                return True
            # Counted from before the question, as the lease is: it ends no later than the lease.
            self._none_until = asked + NO_BUDGETS_CACHE_S
            return False

    def charge(
        self, scope: CallScope, cost_usd: Decimal, charge_id: UUID, at: datetime | None = None
    ) -> list[Raised]:
        """Add the recorded cost of a call made elsewhere, once per ``charge_id``, to the windows
        holding ``at`` (when it was recorded; None: now); the alerts it raised. A charge that
        waited for the ledger past midnight counted in the next day, taken from the clock."""
        if self._ledger is None or time.monotonic() < self._none_until:
            return []
        raised = self._ledger.charge(scope, cost_usd, at or self._store.clock(), charge_id)
        self._record_alerts(raised)
        return raised

    def charge_stored(self, charge: Callable[[], list[Raised]]) -> None:
        """Run ``charge`` (a ``charge`` of a step already stored) and notify its alerts; while
        the ledger is away, queue it to be tried again for up to ``CHARGE_RETRY_S``
        (``later_charges.py``: one thread for all, oldest first).

        The step's call must not fail for its charge: it was stored, and a caller told
        ``StoreUnavailable`` retries, which without a key stores the step twice. The charge
        counts once per charge id however often it is tried.
        """
        try:
            self.notify(charge())
        except StoreUnavailable:
            self.later.add(lambda: self.notify(charge()))

    def reserve(
        self, scope: CallScope, estimate: Decimal, reservation_id: UUID | None = None
    ) -> Reservation | None:
        """Hold the call's estimated maximum in every budget it is charged to (None: no budget),
        as ``reservation_id`` when given (``step_hold_id``), else a new id.

        Raises BudgetExceeded when an enforced budget cannot take it; nothing is held then.
        """
        # One writer asks whether there are budgets (``active``); concurrent steps wait for its
        # answer. Each step used to reserve and then ask on its own whenever the answer had
        # expired: a burst of both queries a second, which grew the ledger's pool to its limit.
        ledger = self._ledger
        if ledger is None or not self.active():
            return None
        return ledger.reserve(
            scope, estimate, self._store.clock(), _seconds(self.reservation_ttl_s), reservation_id or uuid4()
        )

    def spend_lost(self, reservation_id: UUID) -> list[Raised]:
        """Take the hold of a call whose worker was lost as spent at its estimate (its cost is not
        known); append the alerts it raised. Nothing when no such hold is open."""
        if self._ledger is None:
            return []
        raised = self._ledger.spend_held(self._tenant, reservation_id)
        self._record_alerts(raised)
        return raised

    def settle(
        self,
        reservation: Reservation,
        cost_usd: Decimal,
        *,
        held_only: bool = False,
        at: datetime | None = None,
    ) -> list[Raised]:
        """Record the call's cost in place of its hold, in the windows holding ``at`` (when the
        cost is recorded, the stamp of the event that records it; None: now); append the alerts
        it raised (once each). ``held_only``: a settlement tried again records nothing once its
        hold is gone."""
        if self._ledger is None:
            return []
        when = at or self._store.clock()
        raised = self._ledger.settle(self._tenant, reservation, cost_usd, when, held_only=held_only)
        self._record_alerts(raised)
        return raised

    def settle_surely(self, reservation: Reservation, cost_usd: Decimal) -> None:
        """``settle``, and notify its alerts; while the ledger is away, the settlement is queued
        and tried again as ``charge_stored`` tries a charge (then ``held_only``: a try whose
        reply was lost may have committed). For a task's model call: its answer is recorded
        whether or not the ledger can take its cost now."""
        tries = itertools.count()
        at = self._store.clock()  # a try that waited for the ledger counts where the first would

        def settle() -> list[Raised]:
            return self.settle(reservation, cost_usd, held_only=next(tries) > 0, at=at)

        self.charge_stored(settle)

    def _record_alerts(self, raised: list[Raised]) -> None:
        """Append each alert as ``Budget.AlertRaised``. The ledger has marked it raised already
        and will not raise it again, so an append the store cannot make now waits with the
        stored steps' charges (``later_charges.py``) instead of being lost; a retried charge
        found its alerts marked and raised nothing, so neither the event nor the webhook ever
        came. Appending it again is safe: ``Budget.raise_alert`` records a threshold once per
        window."""
        for alert in raised:
            write = partial(self._store.write, f"budget:{alert.budget_id}", partial(self._alert, alert))
            try:
                write()
            except StoreUnavailable:
                self.later.add(write)

    def _alert(self, raised: Raised, uow: UnitOfWork) -> bool:
        budget: Budget | None = uow.find(raised.budget_id)
        if budget is None:
            return False
        return budget.raise_alert(raised.alert.window_start, raised.alert.threshold, raised.alert.spent_usd)

    def notify(self, raised: list[Raised]) -> None:
        """Hand each alert with a webhook to the notifier (returns at once)."""
        if self.notifier is None:
            return
        for alert in raised:
            if alert.alert.spec.webhook_url is not None:
                self.notifier.notify(alert.alert, alert.webhook_secret)


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
