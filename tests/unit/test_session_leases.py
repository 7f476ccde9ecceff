"""Step leases: a live worker holds its step's key; a lapsed lease lets another take over, on the books."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from eventsourcing.application import project_aggregate
from eventsourcing.persistence import DatetimeAsISO, DecimalAsStr, JSONTranscoder, Mapper, UUIDAsHex

from flowledger.domain import LlmUsage, Session, ValidationError
from flowledger.domain.errors import StepInProgress
from flowledger.domain.session import LEGACY_LEASE, WORKER_LOST, StepNotPending
from flowledger.domain.session_views import MAYBE_SEEN, PendingStep
from flowledger.infrastructure.transcodings import register_transcodings

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=15)


def a_session() -> Session:
    return Session.start(
        session_id="s1",
        tenant="t",
        workflow="cs",
        user_id=None,
        expires_at=T0 + timedelta(days=1),
        metadata={},
    )


def started(key: str = "k1", worker: str = "w1", at: datetime = T0) -> Session:
    session = a_session()
    session.start_step(
        step="answer", input={"q": 1}, model="m", key=key, now=at, lease_until=at + LEASE, worker=worker
    )
    return session


def spent() -> LlmUsage:
    return LlmUsage(
        provider="sim", request_model="m", input_tokens=10, output_tokens=5, cost_usd=Decimal("0.002")
    )


def json_mapper() -> Mapper[Any]:
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    register_transcodings(transcoder)
    return Mapper(transcoder=transcoder)


def test_a_started_step_is_pending_with_its_worker_and_lease() -> None:
    session = started()
    assert session.state().pending == (
        PendingStep(
            step="answer",
            input={"q": 1},
            model="m",
            idempotency_key="k1",
            started_at=T0,
            lease_until=T0 + LEASE,
            worker="w1",
        ),
    )


def test_a_lease_must_end_after_the_step_starts() -> None:
    session = a_session()
    with pytest.raises(ValidationError) as raised:
        session.start_step(step="a", input={}, model=None, key="k1", now=T0, lease_until=T0, worker="w1")
    assert raised.value.field == "lease_until"
    assert len(session.pending_events) == 1


def test_the_live_worker_renews_its_lease() -> None:
    session = started()
    session.renew_lease("k1", T0 + 2 * LEASE, worker="w1")
    assert session.pending["k1"].lease_until == T0 + 2 * LEASE
    assert isinstance(session.pending_events[-1], Session.StepLeaseRenewed)


@pytest.mark.parametrize(("key", "worker"), [("other", None), ("k1", "w2")])
def test_a_lease_is_renewed_only_by_the_worker_of_a_pending_step(key: str, worker: str | None) -> None:
    session = started()
    with pytest.raises(StepNotPending) as raised:
        session.renew_lease(key, T0 + 2 * LEASE, worker=worker)
    assert (raised.value.session_id, raised.value.idempotency_key) == ("s1", key)
    assert len(session.pending_events) == 2


def test_a_finished_step_has_no_lease_to_renew() -> None:
    session = started()
    session.record_step(step="answer", input={"q": 1}, output={"a": 2}, idempotency_key="k1")
    with pytest.raises(StepNotPending, match=r"no step of session 's1' is pending as 'k1'"):
        session.renew_lease("k1", T0 + 2 * LEASE)


def test_a_step_is_not_abandoned_while_its_lease_runs() -> None:
    session = started()
    with pytest.raises(StepInProgress) as raised:
        session.abandon_step("k1", T0 + LEASE - timedelta(microseconds=1), "worker silent")
    assert raised.value.idempotency_key == "k1"
    assert "k1" in session.pending
    assert len(session.pending_events) == 2


def test_an_abandoned_step_keeps_the_lost_attempt_and_its_cost_on_the_books() -> None:
    # Given a step whose worker stopped renewing
    session = started()
    # When its lease lapsed and the step is abandoned with what is known of its usage
    failure = session.abandon_step("k1", T0 + LEASE, "worker silent", usage=spent())
    # Then the attempt is a failure of type worker_lost, counted with its cost, and no longer pending
    assert (failure.step, failure.error_type, failure.idempotency_key) == ("answer", WORKER_LOST, "k1")
    assert "w1" in failure.error_message
    state = session.state()
    assert state.pending == ()
    assert state.failure_count == 1
    assert state.totals.cost_usd == Decimal("0.002")
    # A failed key may be retried (no outcome is recorded under it), by the same request: the
    # key filter keeps it, so another request under it is looked for and refused
    assert session.recorded_outcome("k1") is None
    assert session.outcome_lookup("k1") is MAYBE_SEEN


def test_an_abandoned_step_with_nothing_known_of_its_call_is_unpriced_under_its_model() -> None:
    session = started()
    session.abandon_step("k1", T0 + LEASE, "worker silent")
    usage = session.failures[-1].usage
    # The lost call may have been billed (the provider may have taken the prompt): its cost is
    # not known, not $0. The dashboard files it under the model it asked for; no token is made up.
    assert usage is not None
    assert (usage.request_model, usage.unpriced, usage.extra) == ("m", True, {"usage_reported": False})
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (0, 0, Decimal("0"))


def test_an_abandoned_step_that_named_no_model_is_still_unpriced() -> None:
    # Given a step started without a model (an adapter that does not say its default)
    session = a_session()
    session.start_step(
        step="answer", input={}, model=None, key="k1", now=T0, lease_until=T0 + LEASE, worker="w1"
    )
    # When its lease lapses
    session.abandon_step("k1", T0 + LEASE, "worker silent")
    # Then the lost call is still on the books as a call of unknown cost
    usage = session.failures[-1].usage
    assert usage is not None
    assert (usage.request_model, usage.unpriced) == ("", True)


def test_abandoning_a_step_that_is_not_pending_is_refused() -> None:
    with pytest.raises(StepNotPending, match=r"no step of session 's1' is pending as 'k1'"):
        a_session().abandon_step("k1", T0, "no such step")


def test_starting_a_step_held_under_a_live_lease_is_refused() -> None:
    session = started()
    with pytest.raises(StepInProgress, match=r"step 'k1' of session 's1' is still in progress"):
        session.start_step(
            step="answer",
            input={},
            model=None,
            key="k1",
            now=T0 + timedelta(seconds=1),
            lease_until=T0 + LEASE * 2,
            worker="w2",
        )
    assert session.pending["k1"].worker == "w1"
    assert len(session.pending_events) == 2


def test_taking_over_a_lapsed_step_records_the_lost_attempt_first() -> None:
    session = started()
    later = T0 + LEASE
    session.start_step(
        step="answer", input={}, model=None, key="k1", now=later, lease_until=later + LEASE, worker="w2"
    )
    kinds = [type(e).__name__ for e in session.pending_events]
    assert kinds == ["Started", "StepStarted", "StepFailed", "StepStarted"]
    assert session.failures[-1].error_type == WORKER_LOST
    assert (session.pending["k1"].worker, session.pending["k1"].lease_until) == ("w2", later + LEASE)


@pytest.mark.parametrize(
    ("stored_version", "dropped", "started_at"),
    [(2, ("lease_until", "worker"), T0), (1, ("lease_until", "worker", "started_at"), None)],
)
def test_steps_started_before_leases_load_with_a_five_minute_lease_and_an_unknown_worker(
    stored_version: int, dropped: tuple[str, ...], started_at: datetime | None
) -> None:
    # Given a StepStarted stored by an older version (its timestamp is the library's wall clock)
    session = started(at=T0)
    events = session.collect_events()
    mapper = json_mapper()
    stored = mapper.to_stored_event(events[1])
    body = json.loads(stored.state)
    for name in dropped:
        del body[name]
    body["class_version"] = stored_version
    # When it is read back
    loaded = mapper.to_domain_event(replace(stored, state=json.dumps(body).encode()))
    replayed = project_aggregate(None, [events[0], loaded])
    # Then its worker is unknown and its lease the old five-minute stale-step wait
    assert isinstance(replayed, Session)
    pending = replayed.pending["k1"]
    begun = events[1].timestamp if started_at is None else started_at
    assert (pending.started_at, pending.lease_until, pending.worker) == (
        begun,
        begun + LEGACY_LEASE,
        "unknown",
    )
