"""``Engine.process_step``: a step whose model call the engine makes itself, recorded as events.

StepStarted is saved first (its own short save), the model is called outside any
transaction and outside the per-session lock, then StepProcessed or StepFailed is
saved. Callers sharing an idempotency key share one model call: in one process
through a registry of in-flight futures; across processes by seeing the pending
StepStarted and polling for its outcome. A StepStarted older than
``step_stale_after`` (its worker crashed) is taken over by the next caller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import uuid4

from flowledger.domain.errors import (
    LlmCallFailed,
    LlmError,
    LlmNotConfigured,
    SessionClosed,
    StepInProgress,
)
from flowledger.domain.ports import LlmPort, parse_step_reply, step_messages
from flowledger.domain.session import Session
from flowledger.domain.session_views import SessionState, SessionStatus, StepRecord
from flowledger.domain.values import JsonObject, LlmUsage, require_json, require_name
from flowledger.infrastructure.settings import Settings

T = TypeVar("T")


@dataclass(frozen=True)
class _Go:
    messages: list[dict[str, Any]]


@dataclass(frozen=True)
class _Wait:
    started_at: datetime


class _LeaderGone(Exception):
    """The in-process caller running the step was cancelled; waiters start over."""


class StepProcessing:
    """Mixed into Engine, which provides ``update``, ``get_session``, ``clock`` and ``llm``."""

    llm: LlmPort | None
    clock: Callable[[], datetime]
    settings: Settings
    step_wait_timeout_s: float = 120.0
    step_stale_after: timedelta = timedelta(minutes=5)
    step_poll_interval_s: float = 0.02
    _inflight_steps: dict[tuple[str, str], asyncio.Future[StepRecord]]
    _db_executor: ThreadPoolExecutor

    def update(self, session_id: str, command: Callable[[Session], T]) -> T:
        raise NotImplementedError  # pragma: no cover - Engine implements it

    def get_session(
        self, session_id: str, version: int | None = None, as_of: datetime | None = None
    ) -> SessionState:
        raise NotImplementedError  # pragma: no cover - Engine implements it

    def close(self) -> None:
        raise NotImplementedError  # pragma: no cover - Engine implements it

    async def process_step(
        self,
        session_id: str,
        step: str,
        input: JsonObject | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        *,
        retry_pending: bool = False,
    ) -> StepRecord:
        """Call the model for one step and record the outcome; a known key returns its record.

        Raises an LlmError (after recording StepFailed) when the call fails, and
        StepInProgress when another process holds the key past ``step_wait_timeout_s``.
        ``retry_pending`` takes over a pending step at once (its worker is known dead).
        """
        llm = self.llm
        if llm is None:
            raise LlmNotConfigured()
        require_name("session_id", session_id)
        require_name("step", step)
        payload = input if input is not None else {}
        require_json("input", payload)
        key = require_name("idempotency_key", idempotency_key or f"step-{uuid4().hex}")
        loop = asyncio.get_running_loop()
        inflight = self.__dict__.setdefault("_inflight_steps", {})
        slot = (session_id, key)
        while (running := inflight.get(slot)) is not None and running.get_loop() is loop:
            try:
                return await asyncio.shield(running)
            except _LeaderGone:
                continue
        future: asyncio.Future[StepRecord] = loop.create_future()
        future.add_done_callback(_retrieve)
        inflight[slot] = future
        try:
            record = await self._run_step(llm, session_id, step, payload, model, key, retry_pending)
        except asyncio.CancelledError:
            future.set_exception(_LeaderGone())
            raise
        except BaseException as error:
            future.set_exception(error)
            raise
        else:
            future.set_result(record)
            return record
        finally:
            if inflight.get(slot) is future:
                del inflight[slot]

    async def aclose(self) -> None:
        """Close the LLM adapter (when it has ``aclose``), the worker threads and the engine."""
        closer = getattr(self.llm, "aclose", None)
        if closer is not None:
            await closer()
        executor = self.__dict__.get("_db_executor")
        if executor is not None:
            # Waiting for the worker threads blocks: do it off the event loop.
            await asyncio.to_thread(executor.shutdown, True)
        self.close()

    async def _run_step(
        self,
        llm: LlmPort,
        session_id: str,
        step: str,
        input: JsonObject,
        model: str | None,
        key: str,
        retry_pending: bool,
    ) -> StepRecord:
        while True:
            begun = await self._in_db(
                self.update, session_id, partial(self._begin, step, input, model, key, retry_pending)
            )
            if isinstance(begun, StepRecord):
                return begun
            if isinstance(begun, _Go):
                return await self._call_and_record(llm, session_id, step, input, model, key, begun)
            outcome = await self._await_outcome(session_id, key)
            if outcome is not None:
                return outcome
            # The pending step went stale (or vanished): _begin decides afresh.

    def _begin(
        self, step: str, input: JsonObject, model: str | None, key: str, retry_pending: bool, session: Session
    ) -> StepRecord | _Go | _Wait:
        recorded = session.recorded_outcome(key)
        if recorded is not None:
            return recorded
        now = self.clock()
        pending = session.pending.get(key)
        if pending is not None and not retry_pending and now - pending.started_at < self.step_stale_after:
            return _Wait(pending.started_at)
        session.ensure_open(now)
        messages = step_messages(
            step=step, previous_step=session.current_step, context=session.context, input=input
        )
        session.start_step(step=step, input=input, model=model, key=key, now=now)
        return _Go(messages)

    async def _call_and_record(
        self,
        llm: LlmPort,
        session_id: str,
        step: str,
        input: JsonObject,
        model: str | None,
        key: str,
        go: _Go,
    ) -> StepRecord:
        try:
            reply = await llm.complete(model=model, messages=go.messages, json_mode=True)
        except LlmError as error:
            await self._record_failure(session_id, step, key, error.error_type, str(error), error.usage)
            raise
        except asyncio.CancelledError:
            await asyncio.shield(
                self._record_failure(
                    session_id, step, key, "cancelled", "the caller cancelled the step", None
                )
            )
            raise
        except Exception as error:
            await self._record_failure(session_id, step, key, type(error).__name__, str(error), None)
            raise
        decision = parse_step_reply(reply.content)

        def finish(session: Session) -> StepRecord | str:
            # A worker that took this step over may have finished first: never record twice.
            recorded = session.recorded_outcome(key)
            if recorded is not None:
                return recorded
            if session.status != SessionStatus.ACTIVE:
                # Closed while the model answered: keep what the call cost, take no step.
                session.fail_step(
                    step=step,
                    error_type="session_closed",
                    idempotency_key=key,
                    usage=reply.usage,
                    error_message=f"the session was {session.status} when the model answered",
                )
                return session.status
            return session.record_step(
                step=step,
                input=input,
                output=decision.output(),
                next_step=decision.next_step,
                context_update=decision.context_update,
                usage=reply.usage,
                idempotency_key=key,
            )

        outcome: StepRecord | str = await self._in_db(self.update, session_id, finish)
        if isinstance(outcome, str):
            raise SessionClosed(session_id, outcome)
        return outcome

    async def _record_failure(
        self, session_id: str, step: str, key: str, error_type: str, message: str, usage: LlmUsage | None
    ) -> None:
        def fail(session: Session) -> None:
            if key in session.pending:
                session.fail_step(
                    step=step, error_type=error_type, error_message=message, usage=usage, idempotency_key=key
                )

        await self._in_db(self.update, session_id, fail)

    async def _await_outcome(self, session_id: str, key: str) -> StepRecord | None:
        """Poll until another worker records the key's outcome; None when it went stale."""
        deadline = time.monotonic() + self.step_wait_timeout_s
        interval = self.step_poll_interval_s
        while True:
            state = await self._in_db(self.get_session, session_id)
            for record in reversed(state.history):
                if record.idempotency_key == key:
                    return record
            pending = next((p for p in state.pending if p.idempotency_key == key), None)
            if pending is None:
                failure = next((f for f in reversed(state.failures) if f.idempotency_key == key), None)
                if failure is None:
                    return None
                raise LlmCallFailed(
                    failure.error_message,
                    error_type=failure.error_type,
                    attempts=failure.usage.attempts if failure.usage is not None else 0,
                    usage=failure.usage,
                )
            if self.clock() - pending.started_at >= self.step_stale_after:
                return None
            if time.monotonic() >= deadline:
                raise StepInProgress(session_id, key, self.step_wait_timeout_s)
            await asyncio.sleep(interval)
            interval = min(interval * 2, 1.0)

    async def _in_db(self, function: Callable[..., T], *args: Any) -> T:
        # Database work is blocking (psycopg): run it on threads sized like the pool.
        executor = self.__dict__.get("_db_executor")
        if executor is None:
            executor = self.__dict__.setdefault(
                "_db_executor",
                ThreadPoolExecutor(max_workers=self.settings.pool_size, thread_name_prefix="flowledger-db"),
            )
        return await asyncio.get_running_loop().run_in_executor(executor, partial(function, *args))


def _retrieve(future: asyncio.Future[StepRecord]) -> None:
    # Waiters are optional: mark the exception retrieved so asyncio does not log it.
    if not future.cancelled():
        future.exception()
