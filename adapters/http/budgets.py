"""REST API for budgets under /v1/budgets: list with burn (reader), set and remove (admin).

A budget is addressed by what it limits: ``/v1/budgets/{scope}/{subject}/{period}`` (for
``tenant`` the subject is the key's tenant). The subject may hold ``/``, escaped as ``%2F`` or
not (model names do: ``openrouter/deepseek/deepseek-v3.2``): the route reads it as a path,
the period being the last segment. Amounts are exact decimal strings.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Response, status
from pydantic import BaseModel, Field, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.http.auth import Caller, Reader, rank, requires
from flowledger.adapters.http.errors import responses, worded
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.schemas import ANY_TEXT, MAX_ID, Body, money, money_pattern
from flowledger.adapters.llm.alerts import require_public_destination
from flowledger.domain.budget import listed_url
from flowledger.infrastructure.postgres.budgets import Burn

router = APIRouter(route_class=OneNameRoute, prefix="/v1", tags=["budgets"])
Admin = Annotated[Caller, Depends(requires("admin"))]
Scope = Literal["tenant", "user", "session", "workflow", "model"]
Period = Literal["day", "month", "total"]
SUBJECT_PATTERN = worded(
    r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f.][^\x00-\x1f\x7f-\x9f]*$",
    "must be text that is not blank, not only dots and holds no control characters",
)
"""A budget's subject in its path: a name that is not only dots (``domain.budget.require_subject``;
clients resolve a ``.`` or ``..`` segment away, so such a subject could never be reached)."""
Subject = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_ID,
        pattern=SUBJECT_PATTERN,
        description="What the budget limits: a user, session or workflow id, or a model's price-table"
        " name (which may hold '/', escaped as %2F or not; not only dots); for tenant, the key's tenant",
    ),
]
_LIMIT = {
    "anyOf": [{"type": "string", "pattern": money_pattern(10, 12)}, {"type": "number"}],
    "description": "US dollars, exact: a decimal string (or a number); more than 0",
}


class SetBudget(Body):
    """A budget's terms."""

    limit_usd: Annotated[Decimal, money(10, 12), WithJsonSchema(_LIMIT)] = Field(examples=["25.00"])
    mode: Literal["enforce", "alert"] = "enforce"
    webhook_url: str | None = Field(default=None, max_length=2000, examples=["https://ops.example/hooks"])
    webhook_secret: str | None = Field(default=None, min_length=16, max_length=200)


class BudgetOut(BaseModel):
    """A budget and its current window's burn."""

    budget_id: str
    scope: str
    subject: str
    period: str
    mode: str
    limit_usd: str
    webhook_url: str | None = Field(
        description="The webhook, any credentials in it masked as ***; to a key below admin, its path"
        " and query too (/***): a capability URL's path is its secret"
    )
    window_start: datetime
    spent_usd: str
    reserved_usd: str
    percent: str = Field(
        description="Recorded spend as a percentage of the limit, cut (not rounded) to 2 decimals:"
        " it reads 100.00 only once the 100 % alert is due"
    )

    @classmethod
    def of(cls, burn: Burn, caller: Caller) -> BudgetOut:
        """From the ledger's row, the webhook's URL as ``caller`` may see it (``listed_url``:
        its path and query to an admin only, who may set it)."""
        spec = burn.spec
        return cls(
            budget_id=str(burn.budget_id),
            scope=spec.scope,
            subject=spec.subject,
            period=spec.period,
            mode=spec.mode,
            limit_usd=format(spec.limit_usd, "f"),
            webhook_url=listed_url(spec.webhook_url, path=rank(caller.role) >= rank("admin")),
            window_start=burn.window_start,
            spent_usd=format(burn.spent_usd, "f"),
            reserved_usd=format(burn.reserved_usd, "f"),
            percent=str(burn.percent),
        )


class BudgetSetOut(BaseModel):
    """The budget as set; ``webhook_secret`` only when one was made for it (shown once)."""

    budget: BudgetOut
    changed: bool
    webhook_secret: str | None = None


@router.get("/budgets", responses=responses())
def list_budgets(caller: Reader) -> list[BudgetOut]:
    """The tenant's budgets, each with its current window's spent, reserved and percent."""
    return [BudgetOut.of(burn, caller) for burn in caller.engine.budgets.burn()]


@router.get("/dashboard/budgets", responses=responses(), tags=["analytics"])
def dashboard_budgets(caller: Reader) -> list[BudgetOut]:
    """The dashboard's budget burn as JSON (the same rows as ``GET /v1/budgets``)."""
    return list_budgets(caller)


@router.put(f"/budgets/{{scope}}/{{subject:{ANY_TEXT}}}/{{period}}", responses=responses())
async def set_budget(
    scope: Scope, subject: Subject, period: Period, body: SetBudget, caller: Admin
) -> BudgetSetOut:
    """Set (or change) a budget; checked before each model call of its scope."""
    budgets = caller.engine.budgets
    require_public_destination(body.webhook_url, allow_private=caller.engine.settings.webhook_allow_private)
    made = await run_in_threadpool(
        budgets.set,
        scope,
        subject,
        period,
        body.limit_usd,
        mode=body.mode,
        webhook_url=body.webhook_url,
        webhook_secret=body.webhook_secret,
    )
    burn = await run_in_threadpool(budgets.burn_as_set, made)
    return BudgetSetOut(
        budget=BudgetOut.of(burn, caller), changed=made.changed, webhook_secret=made.webhook_secret
    )


@router.delete(
    f"/budgets/{{scope}}/{{subject:{ANY_TEXT}}}/{{period}}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=responses(404),
)
def remove_budget(scope: Scope, subject: Subject, period: Period, caller: Admin) -> Response:
    """Remove a budget (its windows' spend goes with it)."""
    caller.engine.budgets.remove(scope, subject, period)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
