"""How the ``Engine`` (``facade.py``) is put together over its opened store: the checks of what
a caller passes in, the database server's clock, the audit chain on the recorder, the budget
ledger, agent and classification locks, and the adapter's share of the engine's clock."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from flowledger.domain.bounds import shown
from flowledger.domain.errors import ValidationError
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.ports import AlertNotifier, LlmPort
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task_views import TaskState
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.archive_access import ArchiveAccess
from flowledger.infrastructure.engine.archived_reads import ArchivedReads
from flowledger.infrastructure.engine.budgets import BudgetService
from flowledger.infrastructure.engine.checkpointer import Checkpointer
from flowledger.infrastructure.engine.classification import TaskClassifier
from flowledger.infrastructure.engine.clock import DatabaseClock, server_time, utc_now
from flowledger.infrastructure.engine.erasure import ErasureService
from flowledger.infrastructure.engine.expiry_changes import ExpiryChanges
from flowledger.infrastructure.engine.log import EventLog
from flowledger.infrastructure.engine.ranking import TieBreaker
from flowledger.infrastructure.engine.returned_routing import ReturnedRouting
from flowledger.infrastructure.engine.routed_assignment import RoutedAssignment
from flowledger.infrastructure.engine.sessions import SessionService
from flowledger.infrastructure.engine.step_recording import StepRecording
from flowledger.infrastructure.engine.steps import StepService
from flowledger.infrastructure.engine.store import AggregateStore, Clock
from flowledger.infrastructure.engine.task_budgets import TaskCallBudgets
from flowledger.infrastructure.engine.task_index import LogIndex
from flowledger.infrastructure.engine.task_reads import TaskReads
from flowledger.infrastructure.engine.tasks import TaskService
from flowledger.infrastructure.postgres.agent_lock_lender import AgentLockLender
from flowledger.infrastructure.postgres.agent_locks import AgentLocks
from flowledger.infrastructure.postgres.budgets import PostgresBudgetLedger
from flowledger.infrastructure.postgres.chain import StreamChain
from flowledger.infrastructure.postgres.chain_key_check import checked_chain_key
from flowledger.infrastructure.postgres.checkpoints import AuditTrail
from flowledger.infrastructure.postgres.classification_locks import ClassificationLocks
from flowledger.infrastructure.postgres.database import deadlines_of
from flowledger.infrastructure.postgres.factory import FlowledgerSnapshotRecorder
from flowledger.infrastructure.postgres.group_commit import GroupCommit
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal
from flowledger.infrastructure.settings import MEMORY_URL, Settings

AN_LLM = ("complete", "an LLM adapter (an LlmPort: async complete(...))")
"""What ``llm`` must have, and be called, both where it is given (the constructor, the setter)."""


def require_shape(field_name: str, value: object, method: str, what: str) -> None:
    """Raise ValidationError unless ``value`` is None or has a callable ``method``: an engine
    built with ``llm=5`` was taken, and its first ``process_step`` recorded a failed step and
    raised AttributeError ('int' object has no attribute 'complete'); ``clock=5`` a TypeError."""
    if value is not None and not callable(getattr(value, method, None)):
        raise ValidationError(field_name, f"must be {what}, got {shown(value)}")


def require_arguments(
    settings: Settings | None, clock: Clock | None, llm: LlmPort | None, alerts: AlertNotifier | None
) -> None:
    """The constructor's checks of what it is given, before anything is read or opened."""
    require_shape("clock", clock, "__call__", "a function returning timezone-aware datetimes")
    require_shape("llm", llm, *AN_LLM)
    require_shape("alerts", alerts, "notify", "an alert notifier (an AlertNotifier: notify(...))")
    require_clock(clock)
    if settings is not None and not isinstance(settings, Settings):
        raise ValidationError("settings", f"must be a Settings, got {type(settings).__name__}")


def require_clock(clock: Clock | None) -> None:
    """Raise ValidationError unless ``clock`` is None or reads a timezone-aware datetime."""
    reading = None if clock is None else clock()
    if clock is not None and (not isinstance(reading, datetime) or reading.utcoffset() is None):
        # Read once here: anything else fails far away (AttributeError: no tzinfo).
        raise ValidationError("clock", f"must return timezone-aware datetimes, got {shown(reading)}")


def database_clock(app: FlowledgerApplication, settings: Settings) -> Clock:
    """The database server's clock, read on the engine's pool (the host's, in memory)."""
    recorder = app.recorder
    if not isinstance(recorder, FlowledgerApplicationRecorder):
        return utc_now
    return DatabaseClock(server_time(recorder.datastore, settings.connect_deadline_s))


def chain_events(
    app: FlowledgerApplication, database_url: str, settings: Settings
) -> tuple[AuditTrail | None, Checkpointer | None]:
    """Every append of the engine stores its events' hashes and seals (docs/audit.md) and
    every snapshot it stores is sealed and checked as it is read (``snapshot_seal.py``), a
    background thread signs checkpoints as configured, and, if switched on, concurrent
    appends share a transaction (group commit). Returns the engine's audit trail and
    checkpointer (None in memory; no checkpointer unless configured)."""
    recorder = app.recorder
    if not isinstance(recorder, FlowledgerApplicationRecorder):
        return None, None
    if settings.group_commit:
        recorder.group = GroupCommit(recorder.append_now, settings.group_commit_leaders)
    audit = AuditTrail(database_url, settings, recorder.max_notification_id, ensure_open=app.ensure_open)
    if not settings.audit_chain:
        return audit, None
    audit.use_chain_key(checked_chain_key(recorder.datastore, recorder.events_table_name, settings))
    chain = StreamChain(audit.chain_key, schema=recorder.datastore.schema, table=recorder.events_table_name)
    recorder.chain = chain
    snapshots = app.snapshots
    if snapshots is not None and isinstance(snapshots.recorder, FlowledgerSnapshotRecorder):
        snapshots.recorder.seal = SnapshotSeal(audit.chain_key)
    if not (settings.checkpoint_every_events or settings.checkpoint_every_s):
        return audit, None
    checkpointer = Checkpointer(
        audit,
        chain,
        every_events=settings.checkpoint_every_events,
        every_s=settings.checkpoint_every_s,
    )
    return audit, checkpointer


def budget_ledger(database_url: str, settings: Settings) -> PostgresBudgetLedger | None:
    """The ledger budgets are reserved and charged in (None in memory)."""
    return (
        None if database_url == MEMORY_URL else PostgresBudgetLedger(database_url, settings.schema, settings)
    )


def classification_locks(database_url: str, settings: Settings) -> ClassificationLocks | None:
    """Across processes, one classify of a task at a time (PostgreSQL only; not behind PgBouncer)."""
    if database_url == MEMORY_URL or settings.pgbouncer:
        return None
    return ClassificationLocks(database_url, settings.schema, deadlines_of(settings))


def takes_agent_locks(database_url: str, settings: Settings) -> bool:
    """Across processes, assigners take turns per agent (PostgreSQL only; not behind
    PgBouncer). A batch holds its locks in a transaction of the object's one connection
    (opened at its first lock), so the engines of ``for_tenant`` borrow one per batch."""
    return not (database_url == MEMORY_URL or settings.pgbouncer or not settings.agent_locks)


def agent_locks_on(app: FlowledgerApplication, database_url: str, settings: Settings) -> AgentLocks:
    """Agent locks on the engine's database (their connection opened at their first lock)."""
    return AgentLocks(
        database_url,
        settings.schema,
        app.recorder.events_table_name.rsplit(".", 1)[-1],  # type: ignore[attr-defined]
        deadlines_of(settings),
        chain=getattr(app.recorder, "chain", None),
    )


def lend_clock(llm: LlmPort | None, clock: Clock) -> None:
    """An adapter that prices by the time of a call reads it from the engine's clock."""
    use_clock: Callable[[Callable[[], datetime]], None] | None = getattr(llm, "use_clock", None)
    if use_clock is not None:
        use_clock(clock)


def routing_check(settings: Settings, llm: LlmPort | None) -> Callable[[str], object] | None:
    """How a routing file's models are checked against the adapter's price table (its
    ``ModelCheck``), or None: no adapter that prices, or no routing file. Only a file the
    operator named is checked: the shipped tiers are priced by the shipped table
    (tests/unit/test_routing_file_prices.py), and an engine kept for sessions with a price
    table of its own models is not refused for tiers nobody chose."""
    if settings.routing_file is None:
        return None
    check: Callable[[str], object] | None = getattr(llm, "check_model", None)
    return check


@dataclass(frozen=True, slots=True)
class SharedParts:
    """What the services of every tenant over one store are built with: the engine's clock,
    audit trail, budget ledger, classification locks and worker threads, and its alert
    notifier, skill catalogue and model tiers."""

    clock: Clock
    audit: AuditTrail | None
    ledger: PostgresBudgetLedger | None
    classification_locks: ClassificationLocks | None
    executor: ThreadPoolExecutor
    alerts: AlertNotifier | None
    catalogue: SkillCatalogue
    tiers: ModelTiers


@dataclass(frozen=True, slots=True)
class TenantServices:
    """One tenant's services over a store, each with its collaborators passed in."""

    sessions: SessionService
    erasure: ErasureService
    budgets: BudgetService
    steps: StepService
    task_reads: TaskReads
    tasks: TaskService
    classifier: TaskClassifier
    tie_breaker: TieBreaker
    archives: ArchiveAccess
    recording: StepRecording
    expiry: ExpiryChanges
    reads: ArchivedReads
    routing: RoutedAssignment


def compose(
    app: FlowledgerApplication,
    store: AggregateStore,
    log: EventLog,
    settings: Settings,
    parts: SharedParts,
    agent_locks: AgentLocks | AgentLockLender | None,
    llm: LlmPort | None,
    get_task: Callable[[str], TaskState],
    open_tasks: Callable[[], list[TaskState]],
    ensure_open: Callable[[str], None],
) -> TenantServices:
    """``settings.tenant``'s services over ``store``: sessions, steps, budgets, tasks and agents
    (with the tenant's task index), classification, erasure and retention; ``ensure_open`` is
    the engine's own (``OpenCheck``), which its public services check too."""
    tenant = settings.tenant
    audit = parts.audit
    archives = ArchiveAccess(app, audit, tenant, parts.clock)
    sessions = SessionService(
        store,
        tenant,
        None if audit is None else lambda session_id: archives.retention().archived_in(session_id),
    )
    erasure = ErasureService(
        store,
        app.data_keys,
        tenant,
        log,
        None if audit is None else lambda streams: archives.retention().bundles_of(streams),
        None if audit is None or not settings.audit_chain else audit.checkpoint,
        None if audit is None else lambda needles: archives.retention().archived_naming(needles),
    )
    budgets = BudgetService(store, parts.ledger, tenant, parts.alerts, ensure_open=ensure_open)
    budgets.charged_as = getattr(llm, "model_key", None)
    steps = StepService(store, sessions, llm, executor=parts.executor, budgets=budgets)
    task_reads = TaskReads(store, tenant, LogIndex(app, tenant, deadline_s=settings.operation_deadline_s))
    tasks = TaskService(
        store,
        task_reads,
        tenant,
        ReturnedRouting(store, parts.catalogue),
        agent_locks,
        aliases=parts.catalogue.skill_aliases,
    )
    classifier = TaskClassifier(
        store,
        task_reads,
        llm,
        catalogue=parts.catalogue,
        tiers=parts.tiers,
        locks=parts.classification_locks,
        lock_wait_s=settings.classify_lock_wait_s,
        budgets=TaskCallBudgets(budgets),
    )
    tie_breaker = TieBreaker(store, task_reads, classifier)
    return TenantServices(
        sessions=sessions,
        erasure=erasure,
        budgets=budgets,
        steps=steps,
        task_reads=task_reads,
        tasks=tasks,
        classifier=classifier,
        tie_breaker=tie_breaker,
        archives=archives,
        recording=StepRecording(sessions, budgets, store, tenant, parts.clock, llm),
        expiry=ExpiryChanges(sessions),
        reads=ArchivedReads(sessions, archives),
        routing=RoutedAssignment(tasks, classifier, tie_breaker, get_task, open_tasks, store.clock),
    )
