"""Budgets over the task router's model calls: a classification, its fallback, a ranking call.

The same rule as a step's call (``steps.py``): before the call, its estimated maximum cost
(the adapter's ``max_cost``) is held in every budget it is charged to; an enforced budget
that cannot take it raises ``BudgetExceeded`` and the call is not made. After the call its
recorded cost replaces the hold (plus the hold per attempt whose cost is not known); a call
that failed without usage releases it ($0). A task's call is charged to the tenant's budgets
and to its model's (by the price table's name); a task has no session, workflow or user, so
no budget of those scopes covers it (docs/budgets.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from flowledger.domain.budget import CallScope
from flowledger.domain.errors import LlmError
from flowledger.domain.ports import LlmPort, LlmReply
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.budgets import BudgetService, call_cost, held_estimate
from flowledger.infrastructure.engine.step_calls import usage_of
from flowledger.infrastructure.postgres.budgets import Reservation


class TaskCallBudgets:
    """Holds and settles the budgets of one tenant's task model calls (None: no budgets)."""

    def __init__(self, budgets: BudgetService | None) -> None:
        self.budgets = budgets

    async def hold(self, llm: LlmPort, model: str, messages: list[dict[str, Any]]) -> Reservation | None:
        """Hold the call's estimated maximum in its budgets (None: none applies). Raises
        BudgetExceeded, holding nothing, when an enforced budget cannot take it.

        An adapter that cannot estimate (no ``max_cost``) holds $0: its calls are still
        refused once a budget is spent, as a step's are."""
        budgets = self.budgets
        if budgets is None or budgets.known_idle():
            return None
        charged_as, amount = held_estimate(llm, model, messages)
        scope = CallScope(tenant=budgets.tenant, session=None, workflow=None, model=charged_as)
        # The reservation runs to its end on its thread: a caller cancelled meanwhile releases it.
        reserving = asyncio.ensure_future(asyncio.to_thread(budgets.reserve, scope, amount))
        try:
            return await asyncio.shield(reserving)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.settle(await reserving, None)
            raise

    async def settle(self, hold: Reservation | None, usage: LlmUsage | None) -> None:
        """Put the call's recorded cost in place of its hold (no usage: release it, $0); its
        alerts go out. A ledger that is away has the settlement tried again in the background."""
        budgets = self.budgets
        if hold is None or budgets is None:
            return
        settling = asyncio.ensure_future(
            asyncio.to_thread(budgets.settle_surely, hold, call_cost(usage, hold))
        )
        await asyncio.shield(settling)

    async def complete(
        self, llm: LlmPort, model: str, messages: list[dict[str, Any]], hold: Reservation | None
    ) -> LlmReply:
        """The model call under ``hold``, settled whatever its outcome (a failure at what it
        reported it used, a cancelled call at what its adapter said it used)."""
        try:
            reply = await llm.complete(model=model, messages=messages, json_mode=True)
        except LlmError as error:
            await self.settle(hold, error.usage)
            raise
        except BaseException as error:
            await self.settle(hold, usage_of(error))
            raise
        await self.settle(hold, reply.usage)
        return reply
