"""The Engine: flowledger's public application service, a thin facade over its use cases.

It builds one ``AggregateStore`` (the single write path) and composes the use cases over
it: sessions, steps that call a model, tasks and agents, task classification. Methods
take and return plain values; ``engine.log`` is the typed read access to the event log.

Each public method hands the call to one composed service, each with its collaborators passed
in: the use cases, and ``step_recording.py`` (steps made elsewhere, priced and charged),
``expiry_changes.py``, ``archived_reads.py`` (reads that tell an archived session apart),
``routed_assignment.py`` (classify first, then assign), ``archive_access.py`` (audit and
retention), ``tenant_engines.py`` (``for_tenant``) and ``engine_closing.py``. ``wiring.py``
composes them and holds the construction helpers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from uuid import UUID

from flowledger.domain.agent import SEED_CAPACITY
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.ports import AlertNotifier, LlmPort
from flowledger.domain.session_views import SessionState, StepRecord
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task_views import AgentState, TaskState
from flowledger.domain.values import JsonObject, LlmUsage, require_name
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.checkpointer import Checkpointer
from flowledger.infrastructure.engine.engine_closing import EngineClosing, OpenCheck, OwnedStore
from flowledger.infrastructure.engine.erasure import ForgetReport
from flowledger.infrastructure.engine.log import EventLog
from flowledger.infrastructure.engine.retention import (
    BeforeCommit,
    BeforeRestore,
    ProjectionRows,
    RestoreReport,
    RetentionReport,
    RetentionService,
)
from flowledger.infrastructure.engine.sessions import (
    ExpiryChange,
    Restart,
    Start,
)
from flowledger.infrastructure.engine.step_calls import StepOutcome
from flowledger.infrastructure.engine.store import AggregateStore, Clock, current_actor
from flowledger.infrastructure.engine.tasks import Creation, Registration
from flowledger.infrastructure.engine.tenant_engines import TenantEngines
from flowledger.infrastructure.engine.wiring import (
    AN_LLM,
    SharedParts,
    agent_locks_on,
    budget_ledger,
    chain_events,
    classification_locks,
    compose,
    database_clock,
    lend_clock,
    require_arguments,
    require_shape,
    routing_check,
    takes_agent_locks,
)
from flowledger.infrastructure.history import HistoryEntry
from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.postgres.agent_lock_lender import AgentLockLender
from flowledger.infrastructure.postgres.agent_locks import AgentLocks
from flowledger.infrastructure.postgres.checkpoints import AuditTrail
from flowledger.infrastructure.postgres.database import ensure_schema, library_env
from flowledger.infrastructure.postgres.embedded import embedded_database_url
from flowledger.infrastructure.postgres.tenants import admit_engine_tenant
from flowledger.infrastructure.router_files import (
    load_model_tiers,
    load_skill_catalogue,
    require_priced,
    require_readable,
    routing_label,
)
from flowledger.infrastructure.settings import MEMORY_URL, Settings


class Engine:
    """Sessions, steps, tasks and agents, stored as events in PostgreSQL (or in memory).

    ``clock`` defaults to the database server's clock (one clock for every engine on the
    database); in-memory engines use the host's. Pass one to control time in tests.
    """

    _audit: AuditTrail | None
    _checkpointer: Checkpointer | None

    def __init__(
        self,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        tenant: str | None = None,
        schema: str | None = None,
        clock: Clock | None = None,
        llm: LlmPort | None = None,
        alerts: AlertNotifier | None = None,
    ) -> None:
        require_arguments(settings, clock, llm, alerts)
        base = settings if settings is not None else Settings.from_env()
        self.settings = base.with_overrides(database_url=database_url, tenant=tenant, schema=schema)
        # The router's files are checked before anything connects: a bad one refuses the engine.
        require_readable("pricing_file", "FLOWLEDGER_PRICING_FILE", self.settings.pricing_file)
        catalogue = load_skill_catalogue(self.settings.skill_catalogue_file)
        tiers = load_model_tiers(self.settings.routing_file, check_model=routing_check(self.settings, llm))
        url = self.settings.database_url or embedded_database_url(self.settings.home)
        # One deadline for the start's database work: the recorders' construction, tried again
        # while the pool finds no connection, ends with it however long the migration took.
        with operation_deadline(self.settings.operation_deadline_s):
            ensure_schema(url, self.settings.schema, self.settings)
            admit_engine_tenant(url, self.settings)  # a new tenant's name: domain.tenant_names
            self.database_url = url
            self.tenant = self.settings.tenant
            env = library_env(
                url, schema=self.settings.schema, pool_size=self.settings.pool_size, settings=self.settings
            )
            self._app = FlowledgerApplication(
                env,
                snapshot_interval=self.settings.snapshot_interval,
                seal_personal_data=self.settings.seal_personal_data,
                data_key_cache_s=self.settings.data_key_cache_s,
            )
        try:
            self._start_over_store(url, clock, llm, alerts, catalogue, tiers)
        except BaseException:
            self._close_half_started()
            raise

    def _start_over_store(
        self,
        url: str,
        clock: Clock | None,
        llm: LlmPort | None,
        alerts: AlertNotifier | None,
        catalogue: SkillCatalogue,
        tiers: ModelTiers,
    ) -> None:
        """Everything the engine builds over its opened store (``__init__``'s second half)."""
        self.clock: Clock = clock if clock is not None else self._database_clock()
        lend_clock(llm, self.clock)
        self._chain_events()
        self._open = OpenCheck(self._app)
        self.log = EventLog(
            self._app, deadline_s=self.settings.operation_deadline_s, ensure_open=self._open.ensure_open
        )
        self.store = AggregateStore(self._app, self.settings, self.clock)
        self._ledger = budget_ledger(url, self.settings)
        make_agent_locks = partial(agent_locks_on, self._app, url, self.settings)
        self._agent_locks = make_agent_locks() if takes_agent_locks(url, self.settings) else None
        self._agent_lender = None if self._agent_locks is None else AgentLockLender(make_agent_locks)
        """Agent locks lent per batch to the engines ``for_tenant`` makes."""
        self._classification_locks = classification_locks(url, self.settings)
        # Database work is blocking (psycopg): run it on threads sized like the pool.
        executor = ThreadPoolExecutor(max_workers=self.settings.pool_size, thread_name_prefix="flowledger-db")
        # admit_engine_tenant is looked up here when called (tests replace it in this module).
        tenants = TenantEngines(
            self._app, url, lambda at, settings: admit_engine_tenant(at, settings), self._made_for
        )
        parts = SharedParts(
            self.clock,
            self._audit,
            self._ledger,
            self._classification_locks,
            executor,
            alerts,
            catalogue,
            tiers,
        )
        owned = OwnedStore(
            self._app,
            tenants,
            self._checkpointer,
            self._agent_locks,
            self._agent_lender,
            self._classification_locks,
        )
        self._parts = parts
        """What the engines ``for_tenant`` makes are built with too."""
        self._compose(parts, self._agent_locks, llm, tenants, owned)

    def _close_half_started(self) -> None:
        """Close what a constructor that failed had opened, now rather than in whichever thread
        the garbage collector runs ``__del__``; the constructor's error is the one raised."""
        for part in ("_classification_locks", "_agent_lender", "_agent_locks", "_ledger", "_app"):
            opened = getattr(self, part, None)
            if opened is not None:
                with contextlib.suppress(Exception):
                    opened.close()

    def _compose(
        self,
        parts: SharedParts,
        agent_locks: AgentLocks | AgentLockLender | None,
        llm: LlmPort | None,
        tenants: TenantEngines[Engine],
        owned: OwnedStore | None,
    ) -> None:
        """The tenant's own services over the store (``wiring.compose``); ``get_task`` and
        ``open_tasks`` are looked up on the engine when a routed assignment calls them."""
        services = compose(
            self._app,
            self.store,
            self.log,
            self.settings,
            parts,
            agent_locks,
            llm,
            lambda task_id: self.get_task(task_id),
            lambda: self.open_tasks(),
            self._open.ensure_open,
        )
        self.sessions = services.sessions
        self.erasure = services.erasure
        self.budgets = services.budgets
        self.steps = services.steps
        self.task_reads = services.task_reads
        self.tasks = services.tasks
        self.classifier = services.classifier
        self.tie_breaker = services.tie_breaker
        self._archives = services.archives
        self._recording = services.recording
        self._expiry = services.expiry
        self._reads = services.reads
        self._routing = services.routing
        self._tenant_engines = tenants
        """The engines ``for_tenant`` made over this store (the owner's, shared): closed with it."""
        self._closing = EngineClosing(self._open, self.tasks, self.steps, self.budgets, owned)

    def for_tenant(self, tenant: str) -> Engine:
        """``tenant``'s engine over this engine's store (this engine itself for its own tenant).

        It shares everything that holds a connection or a thread: the event store's pool and
        notifier, the writers' cache, the clock, the audit trail and its checkpointer, the
        budget ledger, the agent and classification lock connections and the worker threads.
        Only the tenant's own services are apart (sessions, steps in flight, budgets, tasks and
        agents with its task index); every aggregate id is scoped by tenant, so what one
        tenant writes another never finds. Any number of tenants thus use one engine's
        connections (``docs/http.md``). Closing it stops only its own services, and its calls
        are EngineClosed from then on; closing this engine closes every engine it made, and the
        store under them. EngineClosed once this engine is closed (it answered with an engine
        over the closed store, its tenant admitted).
        """
        self._open.ensure_open("for_tenant")
        return self._tenant_engines.engine_for(self, tenant)

    def _made_for(self, settings: Settings) -> Engine:
        """``settings.tenant``'s engine over this engine's store (``for_tenant``)."""
        made = type(self).__new__(type(self))
        made._share_store(self, settings)
        return made

    def _share_store(self, owner: Engine, settings: Settings) -> None:
        """Become ``settings.tenant``'s engine over ``owner``'s store (``for_tenant``)."""
        self.settings = settings
        self.tenant = settings.tenant
        self.database_url = owner.database_url
        self._app = owner._app
        self.clock = owner.clock
        self._open = OpenCheck(owner._app)
        self.log = EventLog(
            owner._app, deadline_s=settings.operation_deadline_s, ensure_open=self._open.ensure_open
        )
        self.store = owner.store
        self._agent_lender = owner._agent_lender
        self._compose(owner._parts, self._agent_lender, owner.llm, owner._tenant_engines, None)

    def _database_clock(self) -> Clock:
        """The database server's clock, read on the engine's pool (the host's, in memory)."""
        return database_clock(self._app, self.settings)

    def _chain_events(self) -> None:
        """Chain, seal and sign this engine's appends as configured (``wiring.chain_events``)."""
        self._audit, self._checkpointer = chain_events(self._app, self.database_url, self.settings)

    @property
    def audit(self) -> AuditTrail:
        """Checkpoints, verification and bundles of this engine's log (PostgreSQL only; EngineClosed
        once closed: its checkpoint was a StoreUnavailable on the closed pool)."""
        self._open.ensure_open("audit")
        return self._archives.audit()

    @property
    def retention(self) -> RetentionService:
        """Retention policies per workflow, archiving closed sessions to verified bundles and
        restoring them (``docs/retention.md``; PostgreSQL only)."""
        self._open.ensure_open("retention")
        return self._archives.retention()

    def archive_sessions(
        self,
        out_dir: str | Path,
        *,
        workflow: str | None = None,
        dry_run: bool = False,
        batch_size: int = 1000,
        projection_rows: ProjectionRows | None = None,
        before_commit: BeforeCommit | None = None,
    ) -> RetentionReport:
        """Archive the closed sessions older than their workflow's retention policy into bundles
        under ``out_dir`` and delete their events, keeping each one's base (``docs/retention.md``).
        ``flowledger.projections.retention.archive`` passes ``projection_rows`` so that rebuilds
        keep the archived sessions' rows; without it, only the live projection builds keep them
        (and ``before_commit``, which refuses while a build being filled is behind them).
        One bundle holds up to ``batch_size`` sessions."""
        self._open.ensure_open("archive_sessions")
        return self._archives.archive(out_dir, workflow, dry_run, batch_size, projection_rows, before_commit)

    def restore_sessions(
        self,
        bundle: str | Path,
        sessions: list[str] | None = None,
        *,
        before_insert: BeforeRestore | None = None,
    ) -> RestoreReport:
        """Put the archived events of ``bundle`` back, checked against its proof and their bases.
        ``flowledger.projections.retention.restore`` passes ``before_insert`` so that no projection
        build that folded the sessions' archived rows reads their events again."""
        self._open.ensure_open("restore_sessions")
        return self._archives.restore(bundle, sessions, before_insert)

    @classmethod
    def in_memory(
        cls,
        *,
        settings: Settings | None = None,
        tenant: str | None = None,
        schema: str | None = None,
        clock: Clock | None = None,
        llm: LlmPort | None = None,
        alerts: AlertNotifier | None = None,
    ) -> Engine:
        """An engine whose events live in this process only (fast unit tests); the
        constructor's options, named and typed (``**kwargs: Any`` let any through a type check)."""
        return cls(
            database_url=MEMORY_URL,
            settings=settings,
            tenant=tenant,
            schema=schema,
            clock=clock,
            llm=llm,
            alerts=alerts,
        )

    @property
    def llm(self) -> LlmPort | None:
        """The LLM adapter ``process_step`` and ``classify_task`` call (None: not configured)."""
        return self.steps.llm

    @llm.setter
    def llm(self, llm: LlmPort | None) -> None:
        require_shape("llm", llm, *AN_LLM)
        check_model = routing_check(self.settings, llm)
        if check_model is not None:
            require_priced(self.classifier.tiers, check_model, routing_label(self.settings.routing_file))
        lend_clock(llm, self.clock)
        self._recording.llm = llm
        self.steps.llm = llm
        self.classifier.llm = llm
        self.budgets.charged_as = getattr(llm, "model_key", None)

    def close(self) -> None:
        """Release database connections and worker threads (an engine of ``for_tenant``: only
        its own services; its owner's close releases the store). Once: a close made while another
        is under way (another thread, ``aclose``) waits for it, and one made after does nothing."""
        self._closing.close()

    async def aclose(self) -> None:
        """Close the LLM adapter, the alert notifier, the worker threads and the engine (an
        engine of ``for_tenant``: only its own services, as ``close``)."""
        await self._closing.aclose()

    @contextmanager
    def acting_as(self, actor: str) -> Iterator[None]:
        """Commands run inside record ``actor`` (e.g. an API key's id) on every event they write;
        a name (``require_name``), checked here rather than by the first save that stores it."""
        self._open.ensure_open("acting_as")
        require_name("actor", actor)
        token = current_actor.set(actor)
        try:
            yield
        finally:
            current_actor.reset(token)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- sessions ----------------------------------------------------------------------

    def session_uuid(self, session_id: str) -> UUID:
        """The aggregate id of a caller's session id in this engine's tenant."""
        return self.sessions.session_uuid(session_id)

    def start_session(
        self,
        session_id: str,
        workflow: str,
        user_id: str | None = None,
        ttl: timedelta = timedelta(hours=24),
        metadata: JsonObject | None = None,
    ) -> SessionState:
        """Start a session; starting it again with the same workflow and user is a no-op."""
        self._open.ensure_open("start_session")
        return self.sessions.start(session_id, workflow, user_id, ttl, {} if metadata is None else metadata)

    def start_or_get_session(
        self,
        session_id: str,
        workflow: str,
        user_id: str | None = None,
        ttl: timedelta = timedelta(hours=24),
        metadata: JsonObject | None = None,
    ) -> Start:
        """``start_session``, saying whether it created the session (``Start.created``) or found
        the one started with the same workflow and user."""
        self._open.ensure_open("start_or_get_session")
        return self.sessions.start_or_get(
            session_id, workflow, user_id, ttl, {} if metadata is None else metadata
        )

    def restart_session(
        self,
        session_id: str,
        workflow: str,
        user_id: str | None = None,
        ttl: timedelta = timedelta(hours=24),
        metadata: JsonObject | None = None,
    ) -> Restart:
        """Start a session, or take an existing one back to ``init`` (history and context kept;
        an expired one lives ``ttl`` from now): the seed's ``create_session``."""
        self._open.ensure_open("restart_session")
        return self.sessions.restart(session_id, workflow, user_id, ttl, {} if metadata is None else metadata)

    def record_step(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        output: JsonObject | None = None,
        next_step: str | None = None,
        context_update: JsonObject | None = None,
        usage: LlmUsage | None = None,
        idempotency_key: str | None = None,
        *,
        user_id: str | None = None,
        usage_as_given: bool = False,
    ) -> StepRecord:
        """Record a step whose model call happened elsewhere; a known key returns its record
        (``user_id``: refused, SessionOwnedByAnother, unless the session has no user or that one).
        A ``usage`` with tokens that states no cost (no ``cost_usd``, ``price_version``,
        ``unpriced`` or provider's charge) is priced as ``priced_usage`` prices it, or flagged
        ``unpriced``: it was recorded at $0, unflagged. ``usage_as_given``: record it as it is."""
        self._open.ensure_open("record_step")
        return self._recording.record(
            session_id,
            step,
            input,
            output,
            next_step,
            context_update,
            usage,
            idempotency_key,
            user_id,
            usage_as_given=usage_as_given,
        )

    def priced_usage(self, usage: LlmUsage) -> LlmUsage:
        """A usage recorded elsewhere that states no cost (REST's ``usage`` without ``cost_usd``),
        priced as the LLM adapter prices its own calls (its table, the engine's clock); one with
        tokens and no price known (no adapter, a model the table lacks) is flagged ``unpriced``.
        Recorded as given, 1,000 tokens of gpt-4.1 cost $0 on the dashboard, in the session's
        totals and in every budget, unflagged."""
        return self._recording.priced(usage)

    async def process_step(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        *,
        merge_input: bool = False,
        user_id: str | None = None,
    ) -> StepRecord:
        """Call the model for one step and record the outcome (see ``StepService.process``;
        ``merge_input``: merge the input into the context first, as the seed's webhook did;
        ``user_id``: refused, SessionOwnedByAnother, unless the session has no user or that one)."""
        self._open.ensure_open("process_step")
        return await self.steps.process(
            session_id, step, input, model, idempotency_key, merge_input=merge_input, user_id=user_id
        )

    async def run_step(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        *,
        merge_input: bool = False,
        user_id: str | None = None,
    ) -> StepOutcome:
        """``process_step``, answered with the session's context after the step too (no second load)."""
        self._open.ensure_open("run_step")
        return await self.steps.run(
            session_id, step, input, model, idempotency_key, merge_input=merge_input, user_id=user_id
        )

    def update_context(
        self, session_id: str, update: JsonObject, *, idempotency_key: str | None = None
    ) -> SessionState:
        """Merge keys into the session context (``{}`` appends nothing and returns the state);
        under an ``idempotency_key``, once (a repeat is answered as the session stands)."""
        self._open.ensure_open("update_context")
        return self.sessions.update_context(session_id, update, idempotency_key=idempotency_key)

    def extend_session(
        self,
        session_id: str,
        ttl: timedelta,
        *,
        reopen_expired: bool = False,
        idempotency_key: str | None = None,
    ) -> SessionState:
        """Add ``ttl`` to the current expiry (24 h + 1 h is 25 h); an expired session stays expired
        unless ``reopen_expired`` (it then lives ``ttl`` from now). A retry under the first call's
        ``idempotency_key`` moves the expiry no further (a retry without a key extends again)."""
        self._open.ensure_open("extend_session")
        return self.sessions.extend(
            session_id, ttl, reopen_expired=reopen_expired, idempotency_key=idempotency_key
        ).state

    def set_expiry(
        self,
        session_id: str,
        expires_at: datetime,
        *,
        reopen_expired: bool = False,
        idempotency_key: str | None = None,
    ) -> SessionState:
        """Set the expiry to a moment after now and at most ``MAX_TTL`` (366 days) ahead (an
        expired session stays expired unless ``reopen_expired``); a retry under its
        ``idempotency_key`` is answered as the first call was."""
        self._open.ensure_open("set_expiry")
        return self.sessions.set_expiry(
            session_id, expires_at, reopen_expired=reopen_expired, idempotency_key=idempotency_key
        ).state

    def change_expiry(
        self,
        session_id: str,
        *,
        by: timedelta | None = None,
        to: datetime | None = None,
        reopen_expired: bool = False,
        idempotency_key: str | None = None,
    ) -> ExpiryChange:
        """``extend_session`` (``by``) or ``set_expiry`` (``to``), answered with the expiry before too."""
        self._open.ensure_open("change_expiry")
        return self._expiry.change(session_id, by, to, reopen_expired, idempotency_key)

    def complete_session(self, session_id: str, resolution: JsonObject | str | None = None) -> SessionState:
        """End the session with a resolution (a JSON object, or a string; none is ``{}``)."""
        self._open.ensure_open("complete_session")
        return self.sessions.complete(session_id, resolution)

    def abandon_session(self, session_id: str, reason: str = "abandoned") -> SessionState:
        """Give the session up."""
        self._open.ensure_open("abandon_session")
        return self.sessions.abandon(session_id, reason)

    def expire_session(self, session_id: str) -> bool:
        """Record ``Expired`` for a session whose expiry has passed by the engine's clock (a
        command on it would record it too); True when this call did, False when the session is
        still live or already closed. ``projections.expiry.expire_overdue`` sweeps a tenant."""
        self._open.ensure_open("expire_session")
        return self.sessions.expire(session_id)

    def get_session(
        self, session_id: str, version: int | None = None, as_of: datetime | None = None
    ) -> SessionState:
        """The session now, at a version, or as it was at a moment (not both). Now, an active
        session whose expiry has passed reads ``expired`` (its event waits for a command).

        An archived session reads now, at its last version and as of a moment at or after its last
        event from its base; an earlier version or moment needs its events: SessionArchived,
        naming the bundle that holds them."""
        self._open.ensure_open("get_session")
        return self._reads.get(session_id, version, as_of)

    def history(self, session_id: str) -> list[HistoryEntry]:
        """The session's events, oldest first (SessionArchived when retention moved them)."""
        self._open.ensure_open("history")
        return self._reads.history(session_id)

    def session_steps(self, session_id: str) -> list[StepRecord]:
        """Every processed step of the session, oldest first (``get_session`` keeps the recent ones)."""
        self._open.ensure_open("session_steps")
        return self._reads.steps(session_id)

    def fork_session(
        self, session_id: str, at_version: int, new_session_id: str, ttl: timedelta = timedelta(hours=24)
    ) -> SessionState:
        """Start ``new_session_id`` from ``session_id``'s state at ``at_version`` (its step and context).

        The new session records ``Forked`` (parent id and version) right after ``Started``, and
        its metadata gains ``forked_from`` / ``forked_at_version`` for dashboards and funnels;
        its steps, usage and totals start from zero, so a step retried with another model can
        be compared with the parent's. Unknown parent: ``SessionNotFound``; a version out of
        range: ``ValidationError``; an existing new id: ``SessionConflict``; nothing appended.
        An archived parent forks at its last version; an earlier one is ``SessionArchived``.
        """
        self._open.ensure_open("fork_session")
        return self.fork_or_get_session(session_id, at_version, new_session_id, ttl).state

    def fork_or_get_session(
        self, session_id: str, at_version: int, new_session_id: str, ttl: timedelta = timedelta(hours=24)
    ) -> Start:
        """``fork_session``, saying whether it created the fork (``Start.created``) or found the
        same fork (parent and version) made before, its answer lost: nothing appended then."""
        self._open.ensure_open("fork_or_get_session")
        return self._reads.fork(session_id, at_version, new_session_id, ttl)

    def forget(self, user_id: str) -> ForgetReport:
        """Erase the user's personal data: record ``DataErased`` on each of their sessions, then
        destroy the sessions' data keys (``docs/erasure.md``). Tokens, cost and latency stay."""
        self._open.ensure_open("forget")
        return self.erasure.forget_user(user_id)

    def forget_session(self, session_id: str) -> ForgetReport:
        """Erase one session's personal data (a session started without a user id, say), and
        that of every session forked from it (each holds a copy of its context)."""
        self._open.ensure_open("forget_session")
        return self.erasure.forget_session(session_id)

    # -- tasks and agents ----------------------------------------------------------------

    def register_agent(
        self, agent_id: str, name: str, skills: Iterable[str], capacity: int = SEED_CAPACITY
    ) -> AgentState:
        """Register an agent (at least one skill; capacity 1 to 10,000, 10 by default as the seed's);
        again with the same fields is a no-op. ``set_agent_capacity(id, 0)`` pauses one."""
        self._open.ensure_open("register_agent")
        return self.tasks.register_agent(agent_id, name, skills, capacity)

    def register_or_get_agent(
        self, agent_id: str, name: str, skills: Iterable[str], capacity: int = SEED_CAPACITY
    ) -> Registration:
        """``register_agent``, saying whether it registered the agent (``Registration.created``)
        or found it registered with the same fields."""
        self._open.ensure_open("register_or_get_agent")
        return self.tasks.register_or_get_agent(agent_id, name, skills, capacity)

    def set_agent_capacity(self, agent_id: str, capacity: int) -> AgentState:
        """Change an agent's capacity (refused below its current load)."""
        self._open.ensure_open("set_agent_capacity")
        return self.tasks.set_agent_capacity(agent_id, capacity)

    def create_task(
        self,
        task_id: str,
        description: str,
        required_skills: Iterable[str] = (),
        priority: str = "medium",
        deadline: datetime | timedelta | None = None,
    ) -> TaskState:
        """Queue a task (see ``TaskService.create_task``)."""
        self._open.ensure_open("create_task")
        return self.tasks.create_task(task_id, description, required_skills, priority, deadline)

    def create_or_get_task(
        self,
        task_id: str,
        description: str,
        required_skills: Iterable[str] = (),
        priority: str = "medium",
        deadline: datetime | timedelta | None = None,
    ) -> Creation:
        """``create_task``, saying whether it created the task (``Creation.created``) or found
        it created with the same fields."""
        self._open.ensure_open("create_or_get_task")
        return self.tasks.create_or_get_task(task_id, description, required_skills, priority, deadline)

    def record_classification(
        self, task_id: str, category: str, complexity: str, estimated_hours: float
    ) -> TaskState:
        """Record a classification made elsewhere; the first one recorded stands."""
        self._open.ensure_open("record_classification")
        return self.classifier.record(task_id, category, complexity, estimated_hours)

    async def classify_task(
        self, task_id: str, model: str | None = None, *, idempotency_key: str | None = None
    ) -> TaskState:
        """Ask the model what the task is and record it with the call's usage (with
        ``idempotency_key``, a retry after the call was answered makes no second call)."""
        self._open.ensure_open("classify_task")
        return await self.classifier.classify(task_id, model, idempotency_key=idempotency_key)

    async def reclassify_task(
        self, task_id: str, model: str | None = None, *, idempotency_key: str | None = None
    ) -> TaskState:
        """Classify again through the model, replacing the classification (see ``TaskClassifier``);
        with ``idempotency_key``, a retry after the call was answered makes no second call."""
        self._open.ensure_open("reclassify_task")
        return await self.classifier.reclassify(task_id, model, idempotency_key=idempotency_key)

    def requeue_task(
        self,
        task_id: str,
        requested_by: str,
        reason: str,
        deadline: datetime | timedelta | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> TaskState:
        """A person sends an escalated task back to the queue; who and why are recorded, and a
        new deadline (a moment or a delay from now): required once the old one has passed.
        With ``idempotency_key``, a retry is answered with the task as the first send left it."""
        self._open.ensure_open("requeue_task")
        return self.tasks.requeue_task(
            task_id, requested_by, reason, deadline, idempotency_key=idempotency_key
        )

    def list_tasks(
        self,
        *,
        status: str | None = None,
        priority: str | None = None,
        agent_id: str | None = None,
        overdue: bool | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[TaskState]:
        """Tasks matching every filter given, oldest first, at most ``limit``, created after the
        task ``after`` (the last id of the previous page; see ``TaskReads.list_tasks``)."""
        self._open.ensure_open("list_tasks")
        return self.task_reads.list_tasks(
            status=status, priority=priority, agent_id=agent_id, overdue=overdue, limit=limit, after=after
        )

    def assign_task(self, task_id: str, *, escalate_when_full: bool = True) -> TaskState:
        """Give a waiting task to the best eligible agent, or escalate it with the reason."""
        self._open.ensure_open("assign_task")
        return self.tasks.assign_task(task_id, escalate_when_full=escalate_when_full)

    async def assign_task_ranked(self, task_id: str, *, escalate_when_full: bool = True) -> TaskState:
        """``assign_task`` as the seed's pipeline runs it (REST and the CLI call this): a waiting
        task that names no skills and was never classified is classified first when a model is
        configured (``classify_task``: its tier's model, usage and budget as always), so that its
        category and words decide who can take it instead of "any agent"; a classification
        that fails holds the task back (TaskNeedsClassification: reclassify it). With
        routing's ``model_ranked_matching`` on, the model of the task's tier then picks among
        agents the rule finds equally good, its usage recorded on the assignment
        (``ranking.py``). For a task with skills, or one classified, exactly ``assign_task``;
        without a model, one that needs classifying is refused (TaskNeedsClassification,
        ``UNCLASSIFIED_NO_MODEL``), nothing recorded, rather than given to any agent."""
        self._open.ensure_open("assign_task_ranked")
        return await self._routing.assign_ranked(task_id, escalate_when_full)

    def assign_pending(
        self, *, limit: int | None = None, escalate_when_full: bool = False
    ) -> list[TaskState]:
        """Assign waiting tasks in queue order (CRITICAL first, then earliest deadline); those
        whose capable agents are all full keep waiting unless ``escalate_when_full``."""
        self._open.ensure_open("assign_pending")
        return self.tasks.assign_pending(limit=limit, escalate_when_full=escalate_when_full)

    async def assign_pending_routed(
        self, *, limit: int | None = None, escalate_when_full: bool = False
    ) -> list[TaskState]:
        """``assign_pending`` as REST and the CLI run it: with a model configured, the waiting
        tasks that name no skills and were never classified (the first ``limit`` of them in
        queue order) are classified first, as ``assign_task_ranked`` does for one, and so are
        those that slide into the window when a failed classification holds one back. A
        refused classification (a budget, an open circuit) stops the classifying (those made
        are kept): the tasks still needing one wait, never given to any agent, and the others
        are offered as always; the refusal is raised when the run then placed no task.
        A task that still needs classifying when the run assigns (no model is configured, or
        it arrived after the run's last look) waits too, returned with ``held_back`` saying
        why (``unclassified_reason``) and taking no place of ``limit``."""
        self._open.ensure_open("assign_pending_routed")
        return await self._routing.assign_pending(limit, escalate_when_full)

    def start_task(
        self, task_id: str, *, agent_id: str | None = None, assignment: int | None = None
    ) -> TaskState:
        """The holding agent began work. ``agent_id`` / ``assignment`` (the task's
        ``times_assigned`` when assigned) name the assignment meant: another is refused
        (TaskAssignmentChanged), nothing recorded."""
        self._open.ensure_open("start_task")
        return self.tasks.start_task(task_id, agent_id=agent_id, assignment=assignment)

    def complete_task(
        self,
        task_id: str,
        resolution: JsonObject | str | None = None,
        *,
        result: JsonObject | None = None,
        agent_id: str | None = None,
        assignment: int | None = None,
    ) -> TaskState:
        """Close the task as done with a resolution (a JSON object, or a string; none is
        ``{}``), as ``complete_session`` takes one, and free its agent, in one write.
        ``result`` is the resolution's name before (accepted; not both). ``agent_id`` /
        ``assignment`` name the assignment meant, as for ``start_task``."""
        self._open.ensure_open("complete_task")
        return self.tasks.complete_task(
            task_id, resolution, result=result, agent_id=agent_id, assignment=assignment
        )

    def release_task(
        self,
        task_id: str,
        reason: str = "released",
        *,
        agent_id: str | None = None,
        assignment: int | None = None,
        idempotency_key: str | None = None,
    ) -> TaskState:
        """Take the task back from its agent; it waits in the queue again. ``agent_id`` /
        ``assignment`` name the assignment meant, as for ``start_task``; with
        ``idempotency_key`` a retry is answered with the task as the first send left it."""
        self._open.ensure_open("release_task")
        return self.tasks.release_task(
            task_id, reason, agent_id=agent_id, assignment=assignment, idempotency_key=idempotency_key
        )

    def escalate_overdue(self, now: datetime | None = None) -> list[TaskState]:
        """Escalate every open task whose deadline passed (each once); returns those escalated."""
        self._open.ensure_open("escalate_overdue")
        return self.tasks.escalate_overdue(now)

    def get_task(self, task_id: str, version: int | None = None) -> TaskState:
        """The task now, or at a version."""
        self._open.ensure_open("get_task")
        return self.task_reads.get_task(task_id, version)

    def task_history(self, task_id: str) -> list[HistoryEntry]:
        """The task's events, oldest first."""
        self._open.ensure_open("task_history")
        return self.task_reads.task_history(task_id)

    def get_agent(self, agent_id: str, version: int | None = None) -> AgentState:
        """The agent now, or at a version."""
        self._open.ensure_open("get_agent")
        return self.task_reads.get_agent(agent_id, version)

    def agent_history(self, agent_id: str) -> list[HistoryEntry]:
        """The agent's events, oldest first."""
        self._open.ensure_open("agent_history")
        return self.task_reads.agent_history(agent_id)

    def list_agents(self) -> list[AgentState]:
        """Every registered agent, in registration order."""
        self._open.ensure_open("list_agents")
        return self.task_reads.list_agents()

    def open_tasks(self) -> list[TaskState]:
        """Tasks not completed or escalated, oldest first."""
        self._open.ensure_open("open_tasks")
        return self.task_reads.open_tasks()
