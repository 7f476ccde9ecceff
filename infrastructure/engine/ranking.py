"""The seed's model-ranked skill matching, as a tie-break (routing's ``model_ranked_matching``).

The assignment rule ranks eligible agents by skill coverage, then relative load, then recent
completion time; agents equal on all three are told apart only by a stable hash. With
``model_ranked_matching`` on (off by default) and two or more agents tied that way, an
assignment through ``Engine.assign_task_ranked`` (and ``POST /tasks/{id}/assign``) first
asks the model of the task's priority tier which of them fits the task best. The call
happens before the assignment and outside every lock; the assignment then takes the model's
pick if it is still one of the agents tied for best, else decides by the rule, and the
``Assigned`` event carries the call's usage and, in its reason, what the model said or why
its pick was not used. A failed call or an unusable reply costs the tie-break only: the
rule decides, and the usage the call reported is still recorded. A task the assignment then
neither places nor escalates (its agents filled up during the call and it waits, another
command took it meanwhile, or it is refused), or whose caller was cancelled during a call
that said what it used, records the call as ``Task.RankingDiscarded``:
every call the budgets charge reaches the cost views. Budgets hold the call as
they hold a step's (``task_budgets.py``): one an enforced budget cannot take is not made,
and the assignment raises ``BudgetExceeded`` with the task left waiting as it was.

Across engines (PostgreSQL), a ranking about to call the model holds the task's lock for
``rank`` (``postgres/classification_locks.py``) through the call and the assignment
(``TieBreaker.ranked``); another engine ranking the task meanwhile waits for it (bounded, as a
classification's wait: ``FLOWLEDGER_CLASSIFY_LOCK_WAIT_S``), or finds it free but the task
changed since it read it, and decides again from the task as it is: taken, it asks nothing.
Each engine paid its own call before, the loser's kept only as ``RankingDiscarded``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

from flowledger.domain.assignment import AgentProfile, tied_best
from flowledger.domain.errors import LlmError, ValidationError
from flowledger.domain.ports import LlmPort
from flowledger.domain.prompts import parse_ranking_reply, ranking_messages
from flowledger.domain.task import Task
from flowledger.domain.task_views import TaskPriority, TaskStatus
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.classification import TaskClassifier
from flowledger.infrastructure.engine.step_calls import usage_of
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_lock_waits import let_go, take_lock
from flowledger.infrastructure.engine.task_reads import TaskReads, task_key

RANK_PURPOSE = "rank"
"""The purpose of a task's lock held through its ranking call and assignment (apart from its
classification's)."""


@dataclass(frozen=True, kw_only=True)
class Ranking:
    """What a ranking call gave an assignment: the agent picked (None when the call failed or
    its reply named none of the tied agents), the call's usage, and a note for the reason
    (what the model said, or why it gave nothing usable)."""

    agent_id: str | None
    usage: LlmUsage | None
    note: str

    def explain(self, chosen: str) -> str:
        """What to add to the reason of an assignment to ``chosen``."""
        if self.agent_id is None:
            return f"{self.note}, the rule decided"
        if self.agent_id == chosen:
            return f"the model's pick ({self.note})"
        # The roster moved during the call, or another engine holds the pick's lock.
        return f"the model picked {self.agent_id}, not among the best it could take ({self.note})"

    def unused(self, why: str) -> str:
        """The reason kept with the call's usage when no assignment or escalation records it
        (``Task.RankingDiscarded``): ``why``, then what the model said."""
        if self.agent_id is None:
            return f"{why}; {self.note}"
        return f"{why}; the model picked {self.agent_id} ({self.note})"


@dataclass(frozen=True)
class _Tie:
    """A waiting task and the agents the rule cannot tell apart for it, as read before a call."""

    task: Task
    tied: list[AgentProfile]
    llm: LlmPort


class TieBreaker:
    """Asks the model to break ties between equally good agents (see the module docstring)."""

    lock_poll_s: float = 0.05
    """How often a ranking waiting for another engine's asks for the task's lock again."""

    def __init__(self, store: AggregateStore, reads: TaskReads, classifier: TaskClassifier) -> None:
        self._store = store
        self._reads = reads
        self._classifier = classifier

    @contextlib.asynccontextmanager
    async def ranked(self, task_id: str) -> AsyncIterator[Ranking | None]:
        """The model's pick among the agents tied for the waiting task, or None when there is
        nothing to ask (switched off, the task is not waiting or is past its deadline, fewer
        than two agents tied), with the task's ranking lock held across engines until the
        block (the assignment) ends, when a call is made (module docstring)."""
        tie = await self._tie(task_id)
        locks = self._classifier.locks
        if tie is None or locks is None:
            yield None if tie is None else await self._ask(tie)
            return
        key, seen = tie.task.id, tie.task.version
        wait_s = self._classifier.lock_wait_s
        taken, waited = await take_lock(locks, key, RANK_PURPOSE, wait_s=wait_s, poll_s=self.lock_poll_s)
        try:
            # Waited for another engine's ranking, or found the lock free with the task changed
            # since it was read (another's whole call and assignment fitted between): decide
            # again from the task as it is now, taken by then, most likely.
            if waited or await self._changed_since(key, seen):
                tie = await self._tie(task_id)
            yield None if tie is None else await self._ask(tie)
        finally:
            if taken:
                await let_go(locks, key, RANK_PURPOSE)

    async def _tie(self, task_id: str) -> _Tie | None:
        """The task and its tied agents when there is a ranking to ask for, else None."""
        self._reads.task_uuid(task_id)  # the id checked whether or not a model is asked
        llm = self._classifier.llm
        if llm is None or not self._classifier.tiers.model_ranked_matching:
            return None
        task: Task | None = await asyncio.to_thread(self._store.load, self._reads.task_uuid(task_id))
        if task is None or task.task_status is not TaskStatus.PENDING or task.held_back is not None:
            return None  # the assignment itself says why (not found, as it stands, or held back)
        if task.is_overdue(self._store.clock()):
            return None  # escalated for its deadline whatever the pick: a call paid for nothing
        # Read now (not a recent copy): an agent registered a moment ago may be one of the tied.
        profiles = await asyncio.to_thread(self._reads.index.agent_profiles)
        tied = tied_best(task.task_id, task.needs.spelt(self._classifier.catalogue.skill_aliases), profiles)
        return _Tie(task, tied, llm) if len(tied) >= 2 else None

    async def _changed_since(self, task: UUID, version: int) -> bool:
        """Whether anything was recorded on the task after ``version``."""
        return bool(await asyncio.to_thread(self._store.events, task, gt=version))

    async def _ask(self, tie: _Tie) -> Ranking:
        """Ask the task's tier model to pick among the tied agents (see the module docstring)."""
        task, tied, task_id, llm = tie.task, tie.tied, tie.task.task_id, tie.llm
        model, _ = self._classifier.route(TaskPriority(task.priority))
        messages = ranking_messages(task, [(p.agent_id, sorted(p.skills)) for p in tied])
        # Refused by a budget: BudgetExceeded before the call, and the task is not assigned
        # (as a step's call is refused: the caller learns the budget stopped it).
        budgets = self._classifier.budgets
        hold = await budgets.hold(llm, model, messages)
        try:
            reply = await budgets.complete(llm, model, messages, hold)
        except LlmError as error:
            note = f"model ranking on {model} failed ({type(error).__name__})"
            return Ranking(agent_id=None, usage=error.usage, note=note)
        except asyncio.CancelledError as error:
            # The budgets charged what its adapter said it used: record it, as a step's is.
            usage = usage_of(error)
            if usage is not None:
                ranking = Ranking(agent_id=None, usage=usage, note=f"model ranking on {model} cancelled")
                keep = asyncio.to_thread(self._keep_cancelled, task_id, ranking, usage)
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.ensure_future(keep))
            raise
        try:
            picked = parse_ranking_reply(reply.content, {p.agent_id for p in tied})
        except ValidationError as error:
            note = f"model ranking on {model} unusable ({error})"
            return Ranking(agent_id=None, usage=reply.usage, note=note)
        note = f"{model}: {picked.reason}"
        return Ranking(agent_id=picked.agent_id, usage=reply.usage, note=note)

    def _keep_cancelled(self, task_id: str, ranking: Ranking, usage: LlmUsage) -> None:
        """Record a cancelled call's usage on its task (``Task.RankingDiscarded``)."""

        def decide(uow: UnitOfWork) -> None:
            task = self._reads.task(uow, task_id)
            task.discard_ranking(ranking.unused("not assigned: cancelled during the call"), usage)

        self._store.write(task_key(task_id), decide)
