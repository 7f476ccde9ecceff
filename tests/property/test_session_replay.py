"""Property: folding the stored events gives back exactly the state the live aggregate reached."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from eventsourcing.application import project_aggregate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowledger.domain import FlowledgerError, LlmUsage, Session
from flowledger.domain.session_views import SessionState
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

Command = Callable[[Session], object]
T0 = datetime(2026, 1, 1, tzinfo=UTC)

names = st.sampled_from(["greet", "classify", "resolve", "survey", ""])
keys = st.none() | st.sampled_from(["k1", "k2", "k3"])
json_values = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4)
contexts = st.dictionaries(st.sampled_from(["a", "b", "c"]), json_values, max_size=3)
usages = st.none() | st.builds(
    LlmUsage,
    request_model=st.sampled_from(["deepseek-v3.2", "gpt-4.1"]),
    input_tokens=st.integers(0, 5000),
    output_tokens=st.integers(0, 800),
    cost_usd=st.decimals(min_value=0, max_value=1, places=8).map(Decimal),
    latency_ms=st.floats(0, 5000),
)


def _record(step: str, ctx: dict[str, Any], usage: LlmUsage | None, key: str | None) -> Command:
    def command(session: Session) -> object:
        if session.recorded_outcome(key) is not None:
            return None
        return session.record_step(
            step=step,
            input={"n": 1},
            output={"ok": True},
            context_update=ctx or None,
            usage=usage,
            idempotency_key=key,
        )

    return command


commands = st.one_of(
    st.builds(_record, names, contexts, usages, keys),
    st.builds(lambda u: lambda s: s.update_context(u), contexts),
    st.builds(
        lambda step, key: (
            lambda s: s.fail_step(step=step, error_type="Timeout", error_message="slow", idempotency_key=key)
        ),
        names,
        keys,
    ),
    st.builds(
        lambda step, key: lambda s: s.start_step(step=step, input={}, model=None, key=key or "", now=T0),
        names,
        keys,
    ),
    st.just(lambda s: s.complete({"resolution": "done"})),
)


def _run(engine: Engine, program: list[Command]) -> None:
    session_id = f"p-{uuid.uuid4().hex}"
    engine.start_session(session_id, "cs")
    live: dict[int, SessionState] = {1: engine.get_session(session_id)}
    aggregate: list[Session] = []

    for command in program:
        before = engine.get_session(session_id).version

        def tracked(session: Session, command: Command = command) -> object:
            session.ensure_open(engine.clock())
            aggregate[:] = [session]
            return command(session)

        try:
            engine.update(session_id, tracked)
        except FlowledgerError:
            # A rejected command appends nothing.
            assert engine.get_session(session_id).version == before
            continue
        state = aggregate[0].state()
        live[state.version] = state

    events = list(engine.app.events.get(engine.session_uuid(session_id)))
    replayed = project_aggregate(None, events)
    assert replayed is not None
    final = max(live)
    assert replayed.state() == live[final]
    assert engine.get_session(session_id) == live[final]
    for version, state in live.items():
        assert engine.get_session(session_id, version=version) == state


@settings(max_examples=60, deadline=None)
@given(program=st.lists(commands, max_size=14))
def test_replayed_state_equals_live_state_in_memory(program: list[Command]) -> None:
    engine = Engine(settings=make_settings(database_url="memory:", snapshot_interval=3))
    _run(engine, program)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(commands, max_size=10))
def test_replayed_state_equals_live_state_on_postgres(
    database_url: str, pg_schema: str, program: list[Command]
) -> None:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=3))
    try:
        _run(engine, program)
    finally:
        engine.close()
