"""``flowledger tasks ...``: the life of a task, as the REST API has it (``/v1/tasks``,
``/v1/queue``): create, classify (or record a classification made elsewhere), assign, run the
queue, sweep deadlines, work, requeue.

One tenant's tasks (``--tenant``, else the engine's). The names, defaults and rules are the
REST API's and the domain's: priorities in any case (medium by default), a deadline as a time
or in hours from now, an outcome as ``resolution`` (``--result``, the older name, too). Model
calls (``classify``, ``reclassify``; ``assign`` when routing asks the model to break ties) go
to FLOWLEDGER_LLM_BASE_URL, as ``serve``'s do.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from functools import partial
from typing import Annotated, Any, TypeVar

import typer

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import fail, reported_errors
from flowledger.adapters.cli.number_arguments import real_number, whole_number
from flowledger.adapters.cli.rendering import history_table
from flowledger.adapters.cli.session_commands import parse_time
from flowledger.adapters.cli.task_rendering import task_line, task_table, tasks_table
from flowledger.domain.bounds import (
    MAX_REASON_LENGTH,
    json_problem,
    require_resolution,
    require_text,
)
from flowledger.domain.errors import ValidationError
from flowledger.domain.hours import deadline_delay
from flowledger.domain.task_checks import MAX_LIST
from flowledger.domain.task_views import (
    CATEGORIES,
    COMPLEXITIES,
    MAX_ESTIMATED_HOURS,
    TaskPriority,
    TaskState,
    TaskStatus,
)
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_NO_MODEL, as_routed
from flowledger.infrastructure.engine.recorded_classification import (
    Recording,
    record_or_get_classification,
)

T = TypeVar("T")
console = cli_console()
tasks_app = typer.Typer(
    help="Tasks: create, classify, assign, run the queue, sweep deadlines, complete, requeue.",
    no_args_is_help=True,
)
TenantOpt = Annotated[str | None, typer.Option(help="Whose tasks (default: FLOWLEDGER_TENANT or 'default').")]
TaskArg = Annotated[str, typer.Argument(help="The task's id.")]
DeadlineOpt = Annotated[
    str | None, typer.Option(help="A deadline: an ISO 8601 time with a zone (or --deadline-hours).")
]
DeadlineHoursOpt = Annotated[
    float | None, typer.Option(help="A deadline, in hours from now.", parser=real_number)
]
AgentOpt = Annotated[
    str | None,
    typer.Option("--agent", help="The agent holding it, as you know it: another holder is refused (exit 4)."),
]
AssignmentOpt = Annotated[
    int | None,
    typer.Option(
        help="Its times_assigned when you were given it: another assignment is refused (exit 4).",
        parser=whole_number,
    ),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(help="Sent again with this key, the command is answered as its first send was."),
]
ModelOpt = Annotated[str | None, typer.Option(help="The model (default: the priority's tier).")]
NO_MODEL = (
    "no model configured: set FLOWLEDGER_LLM_BASE_URL and FLOWLEDGER_LLM_API_KEY"
    " (flowledger simulate-llm serves one)"
)
RECORD_HINT = (
    "or record a classification made elsewhere: flowledger tasks record-classification TASK"
    " --category C --complexity X --hours H"
)
"""The other way to classify a task with no model, said where the lack of one is (the hold's
"(or record a classification)" named a command no edge had)."""


def _deadline(at: str | None, hours: float | None, field: str = "deadline") -> datetime | timedelta | None:
    """A deadline given as a time or in hours from now (not both); the domain bounds it."""
    if at is not None and hours is not None:
        raise ValidationError(f"{field}_hours", f"give {field} (a time) or {field}_hours, not both")
    if hours is not None:
        # Bounded here as REST's deadline_hours is: an overflow said a session's 366 days, and
        # 0.0001 hours (0.36 s), which REST refuses, was taken.
        return deadline_delay(hours, f"{field}_hours")
    return parse_time(at, field) if at is not None else None


def _resolution(text: str | None) -> dict[str, Any] | None:
    """``--resolution`` as the REST body's field: JSON, an object or a string."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValidationError(
            "resolution",
            f"must be JSON, an object or a string in quotes: {error.msg} at character {error.pos}",
        ) from None
    except (ValueError, RecursionError) as error:  # too deep, or a number too long to read
        raise ValidationError("resolution", json_problem(error)) from None
    return require_resolution(value)


def _say(state: TaskState, note: str = "") -> None:
    console.print(task_line(state) + note, markup=False, highlight=False)


def _routed(engine: Engine, state: TaskState) -> TaskState:
    """``state`` as ``run-queue`` and ``assign`` treat it on this command line: with no model
    configured, a task that needs classifying is held back, saying why (``as_routed``)."""
    return as_routed(state, model=bool(engine.settings.llm_base_url), clock=engine.clock)


def _with_model(
    tenant: str | None,
    act: Callable[[Engine], Coroutine[Any, Any, T]],
    *,
    required: bool,
    instead: str = "",
) -> T:
    """``act`` on an engine with the configured model (as ``serve`` builds it), or, when none
    is configured and ``required`` is false, without one; with none required: exit 7, nothing
    done, saying what to do ``instead`` too when given."""
    settings = Settings.from_env()
    if not settings.llm_base_url:
        if required:
            fail(f"{NO_MODEL}; {instead}" if instead else NO_MODEL, 7)
        with Engine(settings=settings, tenant=tenant) as plain:
            return asyncio.run(act(plain))

    async def run() -> T:
        from flowledger.adapters.llm import build_engine  # the HTTP client: only these commands

        engine = build_engine(settings=settings, tenant=tenant)
        try:
            return await act(engine)
        finally:
            await engine.aclose()

    return asyncio.run(run())


@tasks_app.command("create")
def create_task(
    task_id: TaskArg,
    description: Annotated[str, typer.Option(help="What is to be done.")],
    skill: Annotated[
        list[str] | None, typer.Option(help="A required skill (repeat); none: classification derives them.")
    ] = None,
    priority: Annotated[str, typer.Option(help="low, medium, high or critical (any case).")] = "medium",
    deadline: DeadlineOpt = None,
    deadline_hours: DeadlineHoursOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Queue a task; again with the same fields changes nothing (other fields: exit 4)."""
    with reported_errors():
        due = _deadline(deadline, deadline_hours)
        level = TaskPriority.parse(priority).value
        with Engine(tenant=tenant) as engine:
            done = engine.create_or_get_task(task_id, description, skill or [], level, deadline=due)
    _say(
        _routed(engine, done.state),
        "" if done.created else " (it existed with these fields: nothing created)",
    )


@tasks_app.command("list")
def list_tasks(
    status: Annotated[
        str | None, typer.Option(help="pending, assigned, in_progress, completed or escalated.")
    ] = None,
    priority: Annotated[str | None, typer.Option(help="low, medium, high or critical (any case).")] = None,
    agent: Annotated[str | None, typer.Option(help="Held, or completed, by this agent.")] = None,
    overdue: Annotated[
        bool | None, typer.Option("--overdue/--not-overdue", help="Open tasks past (or not) their deadline.")
    ] = None,
    limit: Annotated[
        int, typer.Option(help=f"At most this many (1 to {MAX_LIST:,}).", parser=whole_number)
    ] = 100,
    after: Annotated[str | None, typer.Option(help="The last task id of the page before.")] = None,
    tenant: TenantOpt = None,
) -> None:
    """Tasks matching every filter given, oldest first; a page cut at --limit says how to read
    the next one."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        page = partial(engine.list_tasks, status=status, priority=priority, agent_id=agent, overdue=overdue)
        tasks = [_routed(engine, task) for task in page(limit=limit, after=after)]
        # A page as long as the limit may be all there is: one more row tells.
        more = len(tasks) == limit and bool(page(limit=1, after=tasks[-1].task_id))
    console.print(tasks_table(f"tasks of {engine.tenant}", tasks))
    if more:
        last = tasks[-1].task_id
        console.print(f"more after {last}: add --after {shlex.quote(last)}", markup=False, highlight=False)


@tasks_app.command("show")
def show_task(task_id: TaskArg, tenant: TenantOpt = None) -> None:
    """A task now: status, skills, classification, assignment or escalation."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        task = _routed(engine, engine.get_task(task_id))
    console.print(task_table(task))


@tasks_app.command("history")
def task_history(task_id: TaskArg, tenant: TenantOpt = None) -> None:
    """A task's events, oldest first."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        entries = engine.task_history(task_id)
    console.print(history_table(task_id, entries))


async def _classify(
    engine: Engine, task_id: str, model: str | None, *, again: bool
) -> tuple[TaskState, str, bool]:
    """Classify (``again``: reclassify) the task; with why it failed, when every model call
    of this attempt failed (recorded, as REST records them: the task keeps waiting), else "";
    and whether anything was recorded."""
    before = engine.get_task(task_id).version
    classify = engine.reclassify_task if again else engine.classify_task
    state = await classify(task_id, model)
    made = [entry for entry in engine.task_history(task_id) if entry.version > before]
    if any(entry.event_type.endswith(".Classified") for entry in made):
        return state, "", True
    failed = [entry for entry in made if entry.event_type.endswith(".ClassificationFailed")]
    return state, str(failed[-1].data.get("detail", "")) if failed else "", bool(made)


def _nothing_done(state: TaskState) -> str:
    """Why ``classify`` made no call: the task's line alone read as if it had classified it."""
    if state.classification is not None:
        return " (already classified: nothing done; reclassify classifies again)"
    return f" (not classified: it is {state.status.value}; nothing done)"


def _classified(task_id: str, model: str | None, tenant: str | None, *, again: bool) -> None:
    with reported_errors():
        state, failure, recorded = _with_model(
            tenant,
            lambda engine: _classify(engine, task_id, model, again=again),
            required=True,
            # A recording does not replace a classification: no way to reclassify without a model.
            instead="" if again else RECORD_HINT,
        )
    if failure:
        # REST answers the task as it stands; a script here needs the exit code to see it.
        fail(
            f"task {task_id!r} was not classified ({failure}): the failed calls are recorded and it"
            f" waits; reclassify it",
            7,
        )
    _say(state, "" if recorded or again else _nothing_done(state))


@tasks_app.command("classify")
def classify_task(task_id: TaskArg, model: ModelOpt = None, tenant: TenantOpt = None) -> None:
    """Classify through the model (the priority's tier unless --model); one already classified
    is left as it is. Exit 7: no model configured (nothing recorded), or every call failed;
    exit 8: a budget refused the call (not made, nothing recorded)."""
    _classified(task_id, model, tenant, again=False)


@tasks_app.command("reclassify")
def reclassify_task(task_id: TaskArg, model: ModelOpt = None, tenant: TenantOpt = None) -> None:
    """Classify again through the model, replacing the classification (exit 7 and 8 as classify)."""
    _classified(task_id, model, tenant, again=True)


def _recording_note(done: Recording) -> str:
    """What became of the classification sent: the task's line alone does not show it."""
    stands = done.state.classification
    if stands is None:
        return _nothing_done(done.state)
    said = f"{stands.category}, {stands.complexity}, {stands.estimated_hours:g} h"
    if done.recorded:
        return f" (classification recorded: {said})"
    return f" (already classified as {said}: the first classification recorded stands; nothing done)"


@tasks_app.command("record-classification")
def record_classification(
    task_id: TaskArg,
    category: Annotated[str, typer.Option(help=f"What it is: {', '.join(CATEGORIES)} (any case).")],
    complexity: Annotated[str, typer.Option(help=f"How hard: {', '.join(COMPLEXITIES)} (any case).")],
    hours: Annotated[
        float,
        typer.Option(
            help=f"How long it should take, in hours: above 0, at most {MAX_ESTIMATED_HOURS:,}.",
            parser=real_number,
        ),
    ],
    tenant: TenantOpt = None,
) -> None:
    """Record a classification made elsewhere (no model is called, none need be configured), as
    REST's POST /v1/tasks/{id}/classification: a task held back for want of a model is then
    assigned by its skills. The first classification recorded stands: a task classified
    already, completed or escalated is left as it is (exit 0, the line says so)."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        done = record_or_get_classification(engine, task_id, category, complexity, hours)
        state = _routed(engine, done.state)
    _say(state, _recording_note(done))


@tasks_app.command("assign")
def assign_task(
    task_id: TaskArg,
    escalate_when_full: Annotated[
        bool,
        typer.Option(
            "--escalate-when-full/--wait-when-full",
            help="When every capable agent is full: escalate the task (the default), or leave it waiting.",
        ),
    ] = True,
    tenant: TenantOpt = None,
) -> None:
    """Assign to the best eligible agent, or escalate with the reason; with --wait-when-full a
    task whose capable agents are all full keeps waiting, the line saying why (exit 8: a budget
    refused the model-ranked tie-break routing asks for; the task waits as it was)."""
    with reported_errors():
        state = _with_model(
            tenant,
            lambda engine: engine.assign_task_ranked(task_id, escalate_when_full=escalate_when_full),
            required=False,
        )
    _say(state)


@tasks_app.command("run-queue")
def run_queue(
    limit: Annotated[
        int | None, typer.Option(help=f"At most this many tasks (1 to {MAX_LIST:,}).", parser=whole_number)
    ] = None,
    escalate_when_full: Annotated[
        bool, typer.Option("--escalate-when-full", help="Escalate tasks whose capable agents are all full.")
    ] = False,
    tenant: TenantOpt = None,
) -> None:
    """Offer every waiting task in queue order (priority, then deadline, then age); those that
    name no skills and were never classified are classified first with a model configured, and
    without one wait, held back, each named with why (as REST's run answers them)."""
    with reported_errors():
        offered = _with_model(
            tenant,
            lambda engine: engine.assign_pending_routed(limit=limit, escalate_when_full=escalate_when_full),
            required=False,
        )
    counts = {s: sum(t.status is s for t in offered) for s in (TaskStatus.ASSIGNED, TaskStatus.ESCALATED)}
    waiting = len(offered) - sum(counts.values())
    held = [t for t in offered if t.held_back]
    title = (
        f"queue run: {len(offered)} offered, {counts[TaskStatus.ASSIGNED]} assigned,"
        f" {counts[TaskStatus.ESCALATED]} escalated, {waiting} waiting"
        + (f" ({len(held)} held back)" if held else "")
    )
    console.print(tasks_table(title, offered))
    # The table says "escalated", "held back" or "waiting"; REST's answer says why, and so
    # does a line for each (an escalation's reason was for `tasks show` to find).
    for task in offered:
        if task.held_back or task.waiting or task.status is TaskStatus.ESCALATED:
            _say(task)
    if any(t.held_back == UNCLASSIFIED_NO_MODEL for t in held):
        console.print(f"to classify them: {NO_MODEL}; {RECORD_HINT}", markup=False, highlight=False)


@tasks_app.command("sweep")
def sweep(tenant: TenantOpt = None) -> None:
    """Escalate every open task whose deadline has passed (each once)."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        escalated = engine.escalate_overdue()
    console.print(tasks_table(f"deadline sweep: {len(escalated)} escalated", escalated))


@tasks_app.command("start")
def start_task(
    task_id: TaskArg, agent: AgentOpt = None, assignment: AssignmentOpt = None, tenant: TenantOpt = None
) -> None:
    """The assigned agent started work."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        state = engine.start_task(task_id, agent_id=agent, assignment=assignment)
    _say(state)


@tasks_app.command("complete")
def complete_task(
    task_id: TaskArg,
    resolution: Annotated[
        str | None,
        typer.Option("--resolution", "--result", help='What it produced: JSON, an object or a "string".'),
    ] = None,
    agent: AgentOpt = None,
    assignment: AssignmentOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """The task is done; its agent is freed."""
    with reported_errors():
        outcome = _resolution(resolution)
        with Engine(tenant=tenant) as engine:
            state = engine.complete_task(task_id, outcome, agent_id=agent, assignment=assignment)
    _say(state)


@tasks_app.command("release")
def release_task(
    task_id: TaskArg,
    reason: Annotated[str, typer.Option(help="Why it goes back to the queue.")] = "released",
    agent: AgentOpt = None,
    assignment: AssignmentOpt = None,
    idempotency_key: KeyOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Give the task back to the queue; its agent is freed."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        state = _routed(
            engine,
            engine.release_task(
                task_id, reason, agent_id=agent, assignment=assignment, idempotency_key=idempotency_key
            ),
        )
    _say(state)


@tasks_app.command("requeue")
def requeue_task(
    task_id: TaskArg,
    by: Annotated[str, typer.Option("--by", help="Who sends it back (recorded).")],
    reason: Annotated[str, typer.Option(help="Why (recorded).")],
    deadline: DeadlineOpt = None,
    deadline_hours: DeadlineHoursOpt = None,
    idempotency_key: KeyOpt = None,
    tenant: TenantOpt = None,
) -> None:
    """Send an escalated task back to the queue; a new deadline is needed once the old one passed."""
    with reported_errors():
        # Checked first, as REST's body is: a blank --by is a mistake whatever the task's state.
        require_text("requested_by", by)
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
        due = _deadline(deadline, deadline_hours)
        with Engine(tenant=tenant) as engine:
            state = _routed(
                engine, engine.requeue_task(task_id, by, reason, due, idempotency_key=idempotency_key)
            )
    _say(state)


def register(app: typer.Typer) -> None:
    """Add ``tasks`` to the top-level app."""
    app.add_typer(tasks_app, name="tasks")
