"""Property: a session's state is a pure fold of its events, whatever the commands and snapshots.

Commands run on a live Session the way the store runs them (``begin``/``end`` around each,
on an advancing clock). Then, for every version: replaying the events (through the JSON
mapper, as stored) gives the state the live session had; a snapshot taken at any version,
stored and loaded, then folded forward gives the same final state; and idempotency stays
exact although the state keeps only a window of recent steps.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from unittest import mock

from eventsourcing.application import project_aggregate
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import DatetimeAsISO, DecimalAsStr, JSONTranscoder, Mapper, UUIDAsHex
from hypothesis import event, given
from hypothesis import strategies as st

from flowledger.domain import FlowledgerError, LlmUsage, Session, session_events
from flowledger.domain.session_views import MAYBE_SEEN, NOT_SEEN, SessionState, StepRecord
from flowledger.infrastructure.transcodings import register_transcodings

Command = Callable[[Session, datetime], object]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=15)
WINDOW = 3
"""A small window, so that short programs push steps and keys out of it."""


def json_mapper() -> Mapper[Any]:
    """A mapper that encodes like the engine's: the library's transcodings plus flowledger's."""
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    register_transcodings(transcoder)
    return Mapper(transcoder=transcoder)


MAPPER = json_mapper()

names = st.sampled_from(["greet", "classify", "resolve", "survey"])
KEYS = ["k1", "k2", "k3", "k4", "k5", "k6"]
keys = st.none() | st.sampled_from(KEYS)
workers = st.sampled_from(["w1", "w2"])
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

# Commands look at the session they run on to pick a key it will accept (a free key to
# start, a pending one to renew or abandon), so that nearly every command is applied and
# histories grow long; a few are still refused (a live lease abandoned, an empty step name).


def _free(session: Session, key: str | None) -> str | None:
    return None if key is None or key in session.pending else key


def _pending(session: Session, index: int) -> str | None:
    held = sorted(session.pending)
    return held[index % len(held)] if held else None


def _record(step: str, ctx: dict[str, Any], usage: LlmUsage | None, key: str | None) -> Command:
    def command(session: Session, now: datetime) -> object:
        mine = _free(session, key)
        if isinstance(session.outcome_lookup(mine), StepRecord):
            return None
        return session.record_step(
            step=step,
            input={"n": 1},
            output={"ok": True},
            context_update=ctx or None,
            usage=usage,
            idempotency_key=mine,
        )

    return command


def _fail(step: str, key: str | None, usage: LlmUsage | None) -> Command:
    return lambda s, now: s.fail_step(
        step=step, error_type="Timeout", error_message="slow", usage=usage, idempotency_key=_free(s, key)
    )


def _start(step: str, key: str, worker: str) -> Command:
    def command(session: Session, now: datetime) -> object:
        free = [k for k in [key, *KEYS] if k not in session.pending]
        return session.start_step(
            step=step,
            input={},
            model=None,
            key=free[0] if free else key,
            now=now,
            lease_until=now + LEASE,
            worker=worker,
        )

    return command


def _renew(index: int) -> Command:
    def command(session: Session, now: datetime) -> object:
        key = _pending(session, index)
        if key is None:
            return None
        return session.renew_lease(key, now + LEASE, worker=session.pending[key].worker)

    return command


def _abandon(index: int) -> Command:
    def command(session: Session, now: datetime) -> object:
        key = _pending(session, index)
        return None if key is None else session.abandon_step(key, now, "lost")

    return command


commands = st.one_of(
    st.builds(_record, names, contexts, usages, keys),
    st.builds(_record, names, contexts, usages, keys),
    st.builds(_record, names, contexts, usages, keys),
    st.builds(lambda u: lambda s, now: s.update_context(u), contexts),
    st.builds(_fail, names, keys, usages),
    st.builds(_start, names, st.sampled_from(KEYS), workers),
    st.builds(_start, names, st.sampled_from(KEYS), workers),
    st.builds(_renew, st.integers(0, 5)),
    st.builds(_abandon, st.integers(0, 5)),
    st.just(lambda s, now: s.extend(now + timedelta(hours=2))),
    st.just(lambda s, now: s.record_step(step="", input={}, output={})),  # refused: no step name
)
closing = st.sampled_from(
    [lambda s, now: s.complete({"resolution": "done"}), lambda s, now: s.abandon("gone quiet")]
)
programs = st.builds(
    lambda body, end: body + end,
    st.lists(st.tuples(commands, st.integers(-5, 30)), min_size=15, max_size=80),
    st.lists(st.tuples(closing, st.integers(0, 5)), max_size=1),
)


def _run(program: list[tuple[Command, int]]) -> tuple[Session, list[Any], dict[int, SessionState]]:
    session = Session.start(
        session_id="p",
        tenant="t",
        workflow="cs",
        user_id=None,
        expires_at=T0 + timedelta(hours=1),
        metadata={},
    )
    session.tag_creation("c0", T0)
    live = {1: session.state()}
    refused: list[int] = []
    now = T0
    for number, (command, seconds) in enumerate(program, start=1):
        now += timedelta(seconds=seconds)  # clocks may step back: the stream's time must not
        before = len(session.pending_events)
        session.begin(f"c{number}", now)
        try:
            command(session, now)
        except FlowledgerError:
            assert len(session.pending_events) == before, "a rejected command appends nothing"
            refused.append(number)
        finally:
            session.end()
        live[session.version] = session.state()
    event(f"refused: {100 * len(refused) // max(len(program), 1) // 10 * 10}%+ of commands")
    event(f"events: {(session.version // 10) * 10}+")
    return session, list(session.collect_events()), live


def _stored(events: list[Any]) -> list[Any]:
    return [MAPPER.to_domain_event(MAPPER.to_stored_event(e)) for e in events]


def _through_snapshot(session: Session) -> Session:
    loaded = MAPPER.to_domain_event(MAPPER.to_stored_event(Snapshot.take(session)))
    assert isinstance(loaded, Snapshot)
    restored = loaded.mutate(None)
    assert isinstance(restored, Session)
    return restored


@given(program=programs)
def test_replay_and_snapshots_give_back_the_state_the_live_session_reached(
    program: list[tuple[Command, int]],
) -> None:
    with mock.patch.object(session_events, "RECENT_STEPS", WINDOW):
        session, events, live = _run(program)
        stored = _stored(events)
        timestamps = [e.timestamp for e in stored]
        assert timestamps == sorted(timestamps)
        for version, state in live.items():
            replayed = project_aggregate(None, stored[:version])
            assert isinstance(replayed, Session)
            assert replayed.state() == state
            # A snapshot at this version, loaded and folded forward, ends where the live session did.
            resumed = project_aggregate(_through_snapshot(replayed), stored[version:])
            assert vars(resumed) == vars(session)
        assert len(session.history) <= WINDOW
        assert len(session.failures) <= WINDOW


@given(program=programs)
def test_idempotency_stays_exact_with_a_window_of_recent_steps(program: list[tuple[Command, int]]) -> None:
    with mock.patch.object(session_events, "RECENT_STEPS", WINDOW):
        session, events, _ = _run(program)
    processed = [e for e in events if isinstance(e, Session.StepProcessed)]
    window = processed[-WINDOW:]
    assert session.state().step_count == len(processed)
    assert session.state().failure_count == sum(isinstance(e, Session.StepFailed) for e in events)
    for key in [*KEYS, "never-used"]:
        recent = [e for e in window if e.idempotency_key == key]
        lookup = session.outcome_lookup(key)
        if recent:
            assert lookup == StepRecord.of(recent[-1])
            assert session.recorded_outcome(key) == lookup
        elif any(e.idempotency_key == key for e in processed):
            assert lookup is MAYBE_SEEN
            assert session.recorded_outcome(key) is None
        elif any(isinstance(e, Session.StepFailed) and e.idempotency_key == key for e in events):
            # A failed key is kept in the filter too: a retry must be the same request
            assert lookup is MAYBE_SEEN
            assert session.may_have_used(key)
        else:
            assert lookup is NOT_SEEN
            assert not session.may_have_used(key)
