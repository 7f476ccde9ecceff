"""Steps whose model call happened elsewhere (``Engine.record_step``): recorded, priced as the
adapter prices its own calls when they state no cost, and charged against budgets once."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from uuid import uuid5

from flowledger.domain.budget import CallScope
from flowledger.domain.errors import SessionNotFound, ValidationError
from flowledger.domain.ports import LlmPort
from flowledger.domain.pricing import TOKEN_FIELDS, PriceTable
from flowledger.domain.session import Session
from flowledger.domain.session_views import StepRecord
from flowledger.domain.values import JsonObject, LlmUsage
from flowledger.infrastructure.engine.budgets import BudgetService, recorded_model
from flowledger.infrastructure.engine.sessions import SessionService, StepRequest
from flowledger.infrastructure.engine.store import AggregateStore, Clock
from flowledger.infrastructure.postgres.budgets import Raised


class StepRecording:
    """Records a tenant's steps made elsewhere and charges their cost to its budgets."""

    def __init__(
        self,
        sessions: SessionService,
        budgets: BudgetService,
        store: AggregateStore,
        tenant: str,
        clock: Clock,
        llm: LlmPort | None,
    ) -> None:
        self._sessions = sessions
        self._budgets = budgets
        self._store = store
        self._tenant = tenant
        self._clock = clock
        self.llm = llm
        """The engine's adapter: its price table and the model it charges (``Engine.llm`` sets it)."""

    def record(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None,
        output: JsonObject | None,
        next_step: str | None,
        context_update: JsonObject | None,
        usage: LlmUsage | None,
        idempotency_key: str | None,
        user_id: str | None,
        *,
        usage_as_given: bool = False,
    ) -> StepRecord:
        """``Engine.record_step``: the step recorded, its cost then charged (a known key: its
        record). A usage with tokens that states no cost (``states_no_cost``) is priced first
        (``priced``), unless ``usage_as_given``."""
        if not usage_as_given and isinstance(usage, LlmUsage) and states_no_cost(usage):
            usage = self.priced(usage)
        request = StepRequest(
            step=step,
            input=input if input is not None else {},
            output=output if output is not None else {},
            next_step=next_step,
            context_update=context_update,
            usage=usage,
            idempotency_key=idempotency_key,
            user_id=user_id,
        )
        record = self._sessions.record_step(session_id, request)
        if usage is not None and usage.charged_usd > 0 and not self._budgets.known_idle():
            # Stored now: a ledger that is away is tried again later, never the caller's error.
            self._budgets.charge_stored(partial(self._charge_budgets, session_id, record, usage))
        return record

    def priced(self, usage: LlmUsage) -> LlmUsage:
        """``Engine.priced_usage``: priced by the adapter's table at the engine's clock, or
        flagged ``unpriced`` when it has tokens and no price is known."""
        if not isinstance(usage, LlmUsage):
            raise ValidationError("usage", f"must be an LlmUsage, got {type(usage).__name__}")
        if not any(getattr(usage, token) for token in TOKEN_FIELDS):
            return usage
        prices = getattr(self.llm, "prices", None)
        priced = prices.price_usage(usage, self._clock()) if isinstance(prices, PriceTable) else None
        return priced if priced is not None else replace(usage, unpriced=True)

    def _charge_budgets(self, session_id: str, record: StepRecord, usage: LlmUsage) -> list[Raised]:
        """A call made elsewhere counts against budgets too: charged once per recorded step."""
        if not self._budgets.active():
            return []
        # The writer's copy record_step just saved (read afresh only if it was evicted).
        state = self._store.cached_or_loaded(self._sessions.session_uuid(session_id))
        if not isinstance(state, Session):
            raise SessionNotFound(session_id)
        scope = CallScope(
            tenant=self._tenant,
            session=session_id,
            workflow=state.workflow,
            model=recorded_model(self.llm, usage),
            user=state.user_id,
        )
        charge_id = uuid5(self._sessions.session_uuid(session_id), f"step-cost:{record.version}")
        return self._budgets.charge(scope, usage.charged_usd, charge_id, at=record.recorded_at)


def states_no_cost(usage: LlmUsage) -> bool:
    """Whether ``usage`` has tokens and says nothing of what they cost: no ``cost_usd`` nor
    ``retried_cost_usd``, no ``price_version``, not ``unpriced``, not the provider's charge.
    Recorded so, 1,000 input and 100 output tokens of gpt-4.1 cost $0 in the session's totals,
    on the dashboard and in every budget, unflagged (``Engine.record_step``; REST priced them).
    A free call states its cost by naming a ``price_version``."""
    return (
        usage.cost_usd == 0
        and usage.retried_cost_usd == 0
        and not usage.price_version
        and not usage.unpriced
        and usage.cost_source != "provider"
        and any(getattr(usage, token) for token in TOKEN_FIELDS)
    )
