"""Forgetting a user on PostgreSQL: no plaintext of theirs left anywhere, totals unchanged.

The check reads every row of every table in the test's schemas (the event log, snapshots,
data keys, tracking, every projection table) as text, bytea as hex, and looks for each
personal value the user ever sent, in the clear and hex-encoded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg.conninfo import make_conninfo
from psycopg.sql import SQL, Identifier

from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT
from flowledger.domain.errors import BudgetExceeded, SessionClosed
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit import verify_log
from flowledger.infrastructure.audit_keys import chain_key
from flowledger.infrastructure.postgres import data_keys
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.projections import projector_for
from flowledger.projections.rebuild import rebuild, verify
from flowledger.verify import GENESIS, event_hash, event_mac
from tests.conftest import make_settings
from tests.support.cli import run_cli
from tests.support.llm import ScriptedLlm

USER = "alice-7f3k"
SECRETS = (
    USER,
    "alice@example.org",
    "card ending 4111-zq",
    "refund approved for Alice Smith",
    "12 Elm Street",
    "resolved for Alice Smith",
    "my parcel to Elm",
    "moving to flat 3B on Elm",
)
USAGE = LlmUsage(
    provider="openai",
    request_model="gpt-4.1",
    input_tokens=812,
    output_tokens=64,
    cost_usd=Decimal("0.002136"),
    latency_ms=431.0,
)


FULL_PURGE_WAIT_S = data_keys.PURGE_WAIT_S


@pytest.fixture(autouse=True)
def _rows_not_pages(quick_purge: None) -> None:
    """Every test here purges with tests/conftest.py's 1 s wait (in a clean-clone CI run the
    plaintext test waited the full 30 s for another worker's transaction: 31.5 s), except those
    that read the tables' pages, whose ``patient_engine`` keeps the full wait."""


def _engine(database_url: str, pg_schema: str) -> Engine:
    # Snapshots every 3 events: the forgotten sessions have some before the erasure.
    settings = make_settings(
        database_url=database_url, schema=pg_schema, snapshot_interval=3, seal_personal_data=True
    )
    return Engine(settings=settings)


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    with _engine(database_url, pg_schema) as engine:
        yield engine


@pytest.fixture
def patient_engine(database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """An engine whose purge waits its full time: for the tests that read the tables' pages."""
    monkeypatch.setattr(data_keys, "PURGE_WAIT_S", FULL_PURGE_WAIT_S)
    with _engine(database_url, pg_schema) as engine:
        yield engine


def _alice_and_bob(engine: Engine) -> None:
    engine.start_session("s-a1", "customer_service", user_id=USER, metadata={"email": "alice@example.org"})
    for n in range(4):
        engine.record_step(
            "s-a1",
            f"step_{n}",
            input={"message": "card ending 4111-zq"},
            output={"reply": "refund approved for Alice Smith"},
            context_update={"address": "12 Elm Street"},
            usage=USAGE,
            idempotency_key=f"k-{n}",
        )
    engine.update_context("s-a1", {"note": "12 Elm Street"})
    engine.fork_session("s-a1", 3, "s-a2")
    engine.record_step("s-a2", "retry", input={"message": "my parcel to Elm"}, usage=USAGE)
    engine.complete_session("s-a1", {"summary": "resolved for Alice Smith"})
    engine.start_session("s-a3", "customer_service", user_id=USER)
    engine.abandon_session("s-a3", "moving to flat 3B on Elm")  # a reason is free text, like a resolution
    engine.start_session("s-b1", "customer_service", user_id="bob", metadata={"email": "bob@example.org"})
    engine.record_step("s-b1", "greet", input={"message": "hello from bob"}, usage=USAGE)


def _every_row_as_text(database_url: str, schema: str) -> str:
    """Every row of every table in the test's schemas (``<schema>``, ``<schema>_*``)."""
    parts = []
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'm') AND (n.nspname = %s OR n.nspname LIKE %s)",
            (schema, schema + "\\_%"),
        ).fetchall()
        assert {"flowledger_events", "flowledger_snapshots", "data_keys"} <= {t for _, t in tables}, tables
        for namespace, table in tables:
            rows = conn.execute(
                SQL("SELECT t::text FROM {}.{} t").format(Identifier(namespace), Identifier(table))
            ).fetchall()
            parts.extend(f"{namespace}.{table}: {row[0]}" for row in rows)
    return "\n".join(parts)


def _leaks(dump: str, values: tuple[str, ...]) -> list[str]:
    lowered = dump.lower()
    return [v for v in values if v.lower() in lowered or v.encode().hex() in lowered]


def test_forget_leaves_no_plaintext_of_the_user_in_any_table_and_keeps_every_total(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given a user's sessions (one forked), another user's, and projections built from them
    _alice_and_bob(engine)
    projector = projector_for(engine)
    projector.catch_up()
    before = {s: engine.get_session(s).totals for s in ("s-a1", "s-a2", "s-b1")}
    with psycopg.connect(database_url) as conn:
        reader = projector.names.reader
        spent = conn.execute(
            SQL("SELECT count(*), sum(cost_usd) FROM {}.llm_calls").format(Identifier(reader))
        )
        calls_before = spent.fetchone()
    # The personal values are sealed in the log, but in the clear in the projections' rows
    assert _leaks(_every_row_as_text(database_url, pg_schema), SECRETS)
    stored_before = _event_rows(database_url, pg_schema)
    assert engine.audit is not None
    engine.audit.checkpoint()  # a signed checkpoint over every stream head before the erasure

    # When the user is forgotten and the projections catch up
    report = engine.forget(USER)
    projector.catch_up()

    # Then nothing of theirs is left in any row of any table, and every total is as it was
    assert sorted(report.sessions) == ["s-a1", "s-a2", "s-a3"]
    assert report.keys_destroyed == 3
    dump = _every_row_as_text(database_url, pg_schema)
    assert {".sessions: ", ".llm_calls: ", ".workflow_executions: "} <= {
        name for name in (".sessions: ", ".llm_calls: ", ".workflow_executions: ") if name in dump
    }  # the projections' own tables were read too
    assert _leaks(dump, SECRETS) == []
    assert _leaks(dump, ("hello from bob", "bob@example.org")) == ["hello from bob", "bob@example.org"]
    assert {s: engine.get_session(s).totals for s in ("s-a1", "s-a2", "s-b1")} == before
    with psycopg.connect(database_url) as conn:
        spent = conn.execute(
            SQL("SELECT count(*), sum(cost_usd) FROM {}.llm_calls").format(Identifier(reader))
        )
        assert spent.fetchone() == calls_before
    audit = verify_log(engine.log)
    assert audit.ok, audit.problems
    # And the log is as it was plus one DataErased per session: same bytes, same hashes, and
    # its chain (hashes over the stored ciphertext, seals under the engine's key) verifies
    stored_after = _event_rows(database_url, pg_schema)
    assert stored_after[: len(stored_before)] == stored_before
    assert [row[2].rsplit(".", 1)[-1] for row in stored_after[len(stored_before) :]] == ["DataErased"] * 3
    _assert_chain_verifies(engine, stored_after)
    verified = verify_chain(engine.audit)  # what `flowledger audit verify` runs
    assert verified.ok, verified.findings
    assert verified.checkpoint is not None
    assert verified.events == len(stored_after)


def _event_rows(database_url: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            SQL(
                "SELECT originator_id, originator_version, topic, state, event_hash, event_mac "
                "FROM {}.flowledger_events ORDER BY notification_id"
            ).format(Identifier(schema))
        ).fetchall()


def _assert_chain_verifies(engine: Engine, rows: list[tuple[Any, ...]]) -> None:
    key = chain_key(engine.settings)
    previous: dict[str, bytes] = {}
    for stream, version, topic, state, stored_hash, stored_mac in rows:
        name = str(stream)
        expected = event_hash(previous.get(name, GENESIS), name, version, topic, bytes(state))
        assert bytes(stored_hash) == expected, (name, version)
        assert bytes(stored_mac) == event_mac(key, name, version, expected)
        previous[name] = expected


def test_after_forget_reads_replays_and_projections_show_erased_values(
    engine: Engine, database_url: str
) -> None:
    _alice_and_bob(engine)
    projector = projector_for(engine)
    projector.catch_up()

    engine.forget(USER)
    projector.catch_up()

    state = engine.get_session("s-a1")
    assert (state.erased, state.user_id, state.context, state.metadata) == (
        True,
        ERASED_TEXT,
        ERASED_JSON,
        ERASED_JSON,
    )
    assert state.resolution == ERASED_JSON
    assert state.totals.calls == 4
    assert state.totals.cost_usd == 4 * USAGE.cost_usd
    replayed = engine.get_session("s-a1", version=3)
    assert replayed.history[-1].input == ERASED_JSON
    assert replayed.history[-1].usage == USAGE
    steps = engine.session_steps("s-a1")
    assert [s.output for s in steps] == [ERASED_JSON] * 4
    assert [s.usage for s in steps] == [USAGE] * 4
    assert engine.history("s-a1")[-1].event_type == "Session.DataErased"
    assert engine.get_session("s-b1").history[0].input == {"message": "hello from bob"}
    with psycopg.connect(database_url) as conn:
        reader = projector.names.reader
        row = conn.execute(
            SQL(
                "SELECT user_id, context, metadata, cost_usd FROM {}.sessions WHERE session_id = 's-a1'"
            ).format(Identifier(reader))
        ).fetchone()
    assert row == (ERASED_TEXT, ERASED_JSON, ERASED_JSON, 4 * USAGE.cost_usd)
    # A rebuild from the log gives exactly the rows the live projections hold
    assert verify(projector) == []


def test_an_erased_session_takes_no_more_commands_and_forget_is_idempotent(engine: Engine) -> None:
    _alice_and_bob(engine)
    engine.forget(USER)
    head = engine.log.head()

    with pytest.raises(SessionClosed, match="is erased"):
        engine.record_step("s-a2", "again", input={"message": "new personal data"})
    again = engine.forget(USER)

    assert (again.sessions, again.keys_destroyed) == ((), 0)
    assert engine.log.head() == head


async def test_a_step_whose_model_answers_after_the_user_was_forgotten_is_not_recorded_as_taken(
    engine: Engine,
) -> None:
    # Given a step of alice's in flight, and alice forgotten while the model answers
    engine.start_session("s-late", "support", user_id=USER, metadata={"email": "alice@example.org"})
    engine.llm = llm = ScriptedLlm(usage=USAGE, meanwhile=lambda: engine.forget(USER))
    # When the model's answer comes back, Then the session takes no step (as every later command)
    with pytest.raises(SessionClosed, match="erased"):
        await engine.process_step("s-late", "greet", {"message": "my parcel to Elm"}, idempotency_key="k1")
    assert len(llm.calls) == 1
    kinds = [e.event_type.rsplit(".", 1)[-1] for e in engine.history("s-late")]
    # (a forget slower than a third of the step's lease, as on a loaded machine, lets the live
    # call renew its lease meanwhile: a renewal is no step taken)
    assert [kind for kind in kinds if kind != "StepLeaseRenewed"] == [
        "Started",
        "StepStarted",
        "DataErased",
        "StepFailed",
    ]
    state = engine.get_session("s-late")
    assert state.step_count == 0
    # And what the call cost stays on the books, as every erased session's totals do
    [failure] = state.failures
    assert (failure.error_type, failure.usage) == ("session_closed", USAGE)
    assert state.totals.cost_usd == USAGE.cost_usd


def test_another_engine_stops_reading_plaintext_within_its_key_cache_time(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given another engine (another process, say) that read the user's session and holds its key
    _alice_and_bob(engine)
    settings = make_settings(
        database_url=database_url, schema=pg_schema, data_key_cache_s=0.5, seal_personal_data=True
    )
    with Engine(settings=settings) as other:
        assert other.session_steps("s-a1")[0].input == {"message": "card ending 4111-zq"}

        # When this engine forgets the user
        engine.forget(USER)

        # Then the other engine's state is erased at once, its event reads within the cache time
        assert other.get_session("s-a1").erased
        time.sleep(0.6)
        assert other.session_steps("s-a1")[0].input == ERASED_JSON
        with pytest.raises(SessionClosed):
            other.record_step("s-a1", "late", input={"message": "x"})


def test_a_session_restarted_with_a_user_and_one_without_any_can_be_forgotten(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    engine.start_session("s-anon", "cs")
    engine.record_step("s-anon", "ask", input={"message": "anonymous secret"})
    engine.start_session("s-late", "cs")
    engine.restart_session("s-late", "cs", user_id="gina-2k")
    engine.record_step("s-late", "ask", input={"message": "gina's secret"})

    assert engine.forget("gina-2k").sessions == ("s-late",)
    assert engine.forget_session("s-anon").sessions == ("s-anon",)

    dump = _every_row_as_text(database_url, pg_schema)
    assert _leaks(dump, ("anonymous secret", "gina's secret", "gina-2k")) == []
    assert engine.get_session("s-late").user_id == ERASED_TEXT
    assert engine.get_session("s-anon").user_id is None


async def test_a_step_refused_by_the_users_budget_leaves_nothing_of_the_user_once_forgotten(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given a user whose own budget is spent, so that their next step is refused: the recorded
    # StepFailed's message ("budget user:<id> per day …") and fields name them
    user = "dora-5t9w"
    engine.budgets.set("user", user, "day", "0.001")
    engine.start_session("s-d1", "support", user_id=user)
    engine.record_step("s-d1", "greet", input={"message": "hi"}, usage=USAGE)  # spends the budget
    engine.llm = llm = ScriptedLlm(usage=USAGE)
    with pytest.raises(BudgetExceeded):
        await engine.process_step("s-d1", "ask", {"message": "where is my parcel"}, idempotency_key="k1")
    assert llm.calls == []
    [refused] = engine.get_session("s-d1").failures
    assert user in refused.error_message
    projector = projector_for(engine)
    projector.catch_up()

    # When the user is forgotten and the projections catch up
    engine.forget(user)
    projector.catch_up()

    # Then no byte of the user's id is left in the session's stored events
    stream = engine.session_uuid("s-d1")
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            SQL("SELECT state FROM {}.flowledger_events WHERE originator_id = %s").format(
                Identifier(pg_schema)
            ),
            (stream,),
        ).fetchall()
        seed = conn.execute(
            SQL(
                "SELECT e.error_message FROM {r}.workflow_executions e "
                "JOIN {r}.workflow_states s ON s.id = e.workflow_id "
                "WHERE s.session_id = 's-d1' AND e.error_message IS NOT NULL"
            ).format(r=Identifier(projector.names.reader))
        ).fetchall()
    assert len(rows) >= 5  # Started, StepProcessed, StepStarted, StepFailed, DataErased
    assert [row for row in rows if user.encode() in bytes(row[0])] == []
    # Nor anywhere but in the user's budget, which names them as its subject (the operator's
    # setting, not the user's conversation): its row and its own stream's events
    leaking = {
        line.split(": ", 1)[0].rsplit(".", 1)[-1]
        for line in _every_row_as_text(database_url, pg_schema).splitlines()
        if _leaks(line, (user,))
    }
    assert leaking <= {"budgets", "flowledger_events"}, leaking
    with psycopg.connect(database_url) as conn:
        naming = conn.execute(
            SQL("SELECT DISTINCT topic FROM {}.flowledger_events WHERE position(%s in state) > 0").format(
                Identifier(pg_schema)
            ),
            (user.encode(),),
        ).fetchall()
    assert {topic.rsplit(":", 1)[-1].split(".")[0] for (topic,) in naming} <= {"Budget"}, naming
    # The state, the library's and the REST views read the failure's text and fields as erased,
    # its type as it was (the dashboard counts errors by type)
    [failure] = engine.get_session("s-d1").failures
    assert (failure.error_type, failure.error_message, failure.error_detail) == (
        "budget_exceeded",
        ERASED_TEXT,
        ERASED_JSON,
    )
    failed = [e for e in engine.history("s-d1") if e.event_type.endswith("StepFailed")]
    assert [(e.data["error_message"], e.data["error_detail"]) for e in failed] == [(ERASED_TEXT, ERASED_JSON)]
    with TestClient(create_app(engine)) as client:
        session = client.get("/v1/sessions/s-d1")
        events = client.get("/v1/sessions/s-d1/history")
    assert session.status_code == events.status_code == 200
    assert user not in session.text + events.text
    assert session.json()["failures"][0]["error_message"] == ERASED_TEXT
    # And the seed's execution row of the refused step, rebuilt from the log alike
    assert seed == [("budget_exceeded: [erased]",)]
    assert verify(projector) == []


def test_forget_names_the_users_sessions_recorded_without_sealing_as_left_in_the_clear(
    engine: Engine, database_url: str, pg_schema: str
) -> None:
    # Given two of alice's sessions and one of bob's recorded by an engine that does not seal,
    # and one of alice's recorded sealed
    plain = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=False)
    with Engine(settings=plain) as unsealing:
        unsealing.start_session("s-u2", "customer_service", user_id=USER)
        unsealing.start_session("s-u1", "customer_service", user_id=USER, metadata={"email": "a@example.org"})
        unsealing.start_session("s-b9", "customer_service", user_id="bob")
    engine.start_session("s-a1", "customer_service", user_id=USER)
    # When alice is forgotten
    report = engine.forget(USER)
    # Then the sealed session is erased, and the report names the two that stay in the clear
    assert (report.sessions, report.keys_destroyed) == (("s-a1",), 1)
    assert report.in_the_clear == ("s-u1", "s-u2")
    assert engine.get_session("s-u1").user_id == USER
    # And forgetting her again erases nothing more and still names them
    again = engine.forget(USER)
    assert (again.sessions, again.keys_destroyed, again.in_the_clear) == ((), 0, ("s-u1", "s-u2"))


def test_forgetting_a_session_again_reports_it_already_erased_not_erased_again(engine: Engine) -> None:
    # Given a sealed session that was forgotten
    engine.start_session("s-a1", "customer_service", user_id=USER)
    first = engine.forget_session("s-a1")
    head = engine.log.head()
    # When it is forgotten again
    again = engine.forget_session("s-a1")
    # Then nothing is erased or destroyed this time, and the report says it was erased already
    assert (first.sessions, first.keys_destroyed, first.already_erased) == (("s-a1",), 1, ())
    assert (again.sessions, again.keys_destroyed, again.already_erased) == ((), 0, ("s-a1",))
    assert engine.log.head() == head


def test_forgetting_a_session_erases_the_copies_its_forks_took_of_it(engine: Engine) -> None:
    # Given a session without a user, a fork of it and a fork of that fork: each Forked event
    # holds a copy of the context it was forked with (the card number), under the fork's own key
    engine.start_session("anon-1", "cs")
    engine.record_step("anon-1", "a", input={"card": "4111"}, context_update={"card": "4111"})
    engine.fork_session("anon-1", 2, "anon-1-f")
    engine.record_step("anon-1-f", "b", input={"card": "4111"})
    engine.fork_session("anon-1-f", 3, "anon-1-ff")
    engine.start_session("other", "cs")
    engine.record_step("other", "a", context_update={"card": "5555"})

    # When the session is forgotten (before: 'erased 1 sessions', its forks read {'card': '4111'})
    report = engine.forget_session("anon-1")

    # Then its forks, and theirs, are erased with it; another session is left as it was
    assert sorted(report.sessions) == ["anon-1", "anon-1-f", "anon-1-ff"]
    assert report.keys_destroyed == 3
    for fork in ("anon-1-f", "anon-1-ff"):
        state = engine.get_session(fork)
        assert state.erased
        assert "4111" not in repr(state)
        assert "4111" not in repr(engine.history(fork))
    assert engine.get_session("other").context == {"card": "5555"}
    # And forgetting it again reports every one of them as already erased
    assert sorted(engine.forget_session("anon-1").already_erased) == ["anon-1", "anon-1-f", "anon-1-ff"]


def test_an_erasure_event_deleted_afterwards_is_named_by_audit_verify(engine: Engine) -> None:
    # Given a user's session, checkpointed, then forgotten
    engine.start_session("s-1", "support", user_id="alice")
    engine.record_step("s-1", "answer", input={"q": "secret"})
    engine.audit.checkpoint()
    assert engine.forget("alice").sessions == ("s-1",)
    # When the erasure event (the stream's last) is deleted in the database
    stream = engine.session_uuid("s-1")
    with psycopg.connect(engine.database_url, autocommit=True) as conn:
        deleted = conn.execute(
            SQL(
                "DELETE FROM {}.flowledger_events WHERE originator_id = %s AND topic LIKE %s RETURNING"
                " originator_version"
            ).format(Identifier(engine.settings.schema)),
            [stream, "%DataErased"],
        ).fetchall()
    assert deleted == [(3,)]
    # Then audit verify names it: forget signed a checkpoint over it (it was appended after the
    # latest one, so its deletion from the stream's end went unseen: "ok")
    findings = verify_chain(engine.audit).findings
    assert [(f.kind, f.stream, f.version) for f in findings] == [("deleted", stream, 3)]


def test_a_forget_whose_checkpoint_is_refused_still_reports_the_erasure_it_did(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Forget signs a checkpoint after destroying the keys: with a row forged elsewhere in the log
    since the last checkpoint, that checkpoint is refused, and forget raised "checkpoint
    refused: ..." (exit 1) though the user's keys were already destroyed."""
    # Given a sealed session, and another one with a row inserted by SQL after a checkpoint
    engine.start_session("s-a1", "customer_service", user_id=USER)
    engine.start_session("s-other", "customer_service")
    engine.audit.checkpoint()
    other = engine.session_uuid("s-other")
    events = Identifier(engine.settings.schema, "flowledger_events")
    with psycopg.connect(engine.database_url, autocommit=True) as conn:
        ((previous,),) = conn.execute(
            SQL("SELECT event_hash FROM {} WHERE originator_id = %s").format(events), (other,)
        ).fetchall()
        topic = "flowledger.domain.session:Session.Completed"
        forged = b'{"timestamp":{"_type_":"datetime_iso","_data_":"2026-01-01T00:00:00+00:00"}}'
        conn.execute(
            SQL(
                "INSERT INTO {} (originator_id, originator_version, topic, state, transaction_id, event_hash,"
                " event_mac) VALUES (%s, 2, %s, %s, pg_current_xact_id(), %s, %s)"
            ).format(events),
            (other, topic, forged, event_hash(bytes(previous), str(other), 2, topic, forged), bytes(32)),
        )
    # When the user is forgotten
    with caplog.at_level("WARNING"):
        report = engine.forget_session("s-a1")
    # Then the erasure is reported as done, and the refused checkpoint is said, naming the row
    assert (report.sessions, report.keys_destroyed) == (("s-a1",), 1)
    assert any(f"checkpoint refused: stream {other} version 2" in r.getMessage() for r in caplog.records)
    assert engine.get_session("s-a1").erased


def test_a_data_key_destroyed_or_deleted_in_the_database_without_an_erasure_is_named(engine: Engine) -> None:
    """A data key set to NULL (or its row deleted) by SQL erased a session's inputs and outputs
    with no DataErased event: get_session read them as erased (``erased`` false), and audit
    verify said ok, every row still hashing as written."""
    # Given three users' sessions; alice forgotten as the application forgets
    for user in ("alice", "bob", "carol"):
        engine.start_session(f"s-{user}", "support", user_id=user)
        engine.record_step(f"s-{user}", "answer", input={"q": f"{user}'s secret"})
    engine.forget("alice")
    # When bob's key is destroyed and carol's key row deleted in the database
    keys = Identifier(engine.settings.schema, "data_keys")
    bob, carol = engine.session_uuid("s-bob"), engine.session_uuid("s-carol")
    with psycopg.connect(engine.database_url, autocommit=True) as conn:
        conn.execute(SQL("UPDATE {} SET data_key = NULL WHERE stream_id = %s").format(keys), [bob])
        conn.execute(SQL("DELETE FROM {} WHERE stream_id = %s").format(keys), [carol])
    # Then audit verify names both, and not alice's erasure on record: exit 1
    result = run_cli(engine.database_url, engine.settings.schema, "audit", "verify")
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    said = " with no erasure on record (no DataErased event): its sealed personal fields read as erased"
    assert sorted(problems) == sorted(
        [
            f"problem: data key of stream {bob}: destroyed in the database{said}",
            f"problem: data key of stream {carol}: deleted in the database{said}",
        ]
    ), result.stderr
    # And a session verified alone likewise; alice's alone verifies
    alone = run_cli(engine.database_url, engine.settings.schema, "audit", "verify", "--session", "s-bob")
    assert alone.returncode == 1, alone.stderr
    assert f"data key of stream {bob}: destroyed" in alone.stderr
    assert str(carol) not in alone.stderr
    assert (
        run_cli(
            engine.database_url, engine.settings.schema, "audit", "verify", "--session", "s-alice"
        ).returncode
        == 0
    )


def _pages_holding(database_url: str, schema: str, values: dict[str, bytes]) -> list[str]:
    """Where, in the pages of every relation of the test's schemas (tables, their TOAST and
    indexes, as PostgreSQL has them, dead row versions and free space included), each value's
    bytes are: what someone reading the table's file, or with ``pageinspect``, finds."""
    found = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        relations = conn.execute(
            "SELECT c.oid, n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'm', 'i', 't') AND (n.nspname = %s"
            " OR n.nspname LIKE %s OR c.oid IN (SELECT reltoastrelid FROM pg_class k JOIN pg_namespace"
            " m ON m.oid = k.relnamespace WHERE m.nspname = %s OR m.nspname LIKE %s))",
            (schema, schema + "\\_%", schema, schema + "\\_%"),
        ).fetchall()
        read_pages = _page_reader(conn)
        for oid, name in relations:
            for block, page in enumerate(read_pages(oid)):
                found.extend(f"{what} in {name} block {block}" for what, raw in values.items() if raw in page)
    return found


def _page_reader(conn: psycopg.Connection[Any]) -> Callable[[int], list[bytes]]:
    """The pages of a relation as PostgreSQL has them: through ``pageinspect`` where the server
    has it (PostgreSQL's contrib), else from the relation's files after a ``CHECKPOINT`` (the
    embedded server ships no contrib; it and a local server keep their files on this machine)."""
    try:
        # another worker's may be made at the same moment
        with contextlib.suppress(psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect SCHEMA public")
    except (psycopg.errors.FeatureNotSupported, psycopg.errors.UndefinedFile):
        conn.execute("CHECKPOINT")
        ((data,),) = conn.execute("SHOW data_directory")

        def from_files(oid: int) -> list[bytes]:
            ((path,),) = conn.execute("SELECT pg_relation_filepath(%s)", (oid,))
            raw = (Path(data) / path).read_bytes()
            return [raw[start : start + PAGE] for start in range(0, len(raw), PAGE)]

        return from_files

    def through_pageinspect(oid: int) -> list[bytes]:
        (blocks,) = conn.execute("SELECT pg_relation_size(%s) / 8192", (oid,)).fetchone() or (0,)
        pages = []
        for block in range(blocks):
            ((page,),) = conn.execute("SELECT public.get_raw_page(%s::regclass::text, %s)", (oid, block))
            pages.append(bytes(page))
        return pages

    return through_pageinspect


PAGE = 8192
"""PostgreSQL's page size (the default build, as every server the tests meet)."""


def test_forget_leaves_no_old_key_version_in_the_key_tables_pages(
    patient_engine: Engine, database_url: str, pg_schema: str
) -> None:
    """``forget`` set the key to NULL and ran a plain VACUUM: the old row version, key bytes and
    user id, stayed in the table's page (and the user id in its index) whenever a transaction
    anywhere in the database was open at that moment, until autovacuum came; and a VACUUM that
    removed it left its bytes in the page's free space. Read with pageinspect, the key decrypts
    every sealed field of the session."""
    # Given a user's sessions, with a bystander's, and their keys as stored
    _alice_and_bob(patient_engine)
    keys = Identifier(pg_schema, "data_keys")
    with psycopg.connect(database_url) as conn:
        stored = conn.execute(
            SQL("SELECT stream_id, data_key FROM {} WHERE user_id = %s").format(keys), (USER,)
        ).fetchall()
    assert len(stored) == 3
    values = {f"the key of {stream}": bytes(key) for stream, key in stored} | {"the user id": USER.encode()}
    assert _pages_holding(database_url, pg_schema, values)
    # And another connection reading the database meanwhile (its snapshot begun before the erasure)
    with psycopg.connect(database_url) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute(SQL("SELECT count(*) FROM {}").format(keys))
        # When the user is forgotten while it ends a moment later
        ending = threading.Timer(1.0, reader.rollback)
        ending.start()
        try:
            report = patient_engine.forget(USER)
        finally:
            ending.join()
    # Then no page of the key table, its indexes or any other relation holds a key or the user id
    assert (report.keys_destroyed, report.old_key_versions_remain) == (3, False)
    assert _pages_holding(database_url, pg_schema, values) == []


def test_forget_says_when_an_old_key_version_may_remain_behind_a_long_reader(
    engine: Engine, database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that began before the erasure and outlives the purge's wait keeps the old
    row version visible: no vacuum can remove it, and ``forget`` says so instead of reporting a
    clean erasure."""
    monkeypatch.setattr(data_keys, "PURGE_WAIT_S", 0.3)
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings) as short:
        short.start_session("s-1", "customer_service", user_id=USER)
        with psycopg.connect(database_url) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(SQL("SELECT count(*) FROM {}").format(Identifier(pg_schema, "data_keys")))
            report = short.forget(USER)
            reader.rollback()
    assert (report.keys_destroyed, report.old_key_versions_remain) == (1, True)


def test_forget_says_when_an_old_key_version_may_remain_behind_a_writer_in_another_database(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction holding an xid in another database of the server starts every snapshot
    taken while it runs, the rewrite's own included: the rewrite keeps the old row version, and
    ``forget`` says so (it counted only its own database's transactions and reported a clean
    erasure, the key still in the table's file)."""
    monkeypatch.setattr(data_keys, "PURGE_WAIT_S", 0.3)
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings) as short:
        short.start_session("s-1", "customer_service", user_id=USER)
        keys = Identifier(pg_schema, "data_keys")
        with psycopg.connect(database_url) as conn:
            ((key,),) = conn.execute(SQL("SELECT data_key FROM {}").format(keys)).fetchall()
        with psycopg.connect(make_conninfo(database_url, dbname="postgres")) as writer:
            writer.execute("SELECT txid_current()")
            report = short.forget(USER)
            left = _pages_holding(database_url, pg_schema, {"the key": bytes(key)})
            writer.rollback()
    assert left
    assert (report.keys_destroyed, report.old_key_versions_remain) == (1, True)


def test_after_forget_a_projections_rebuild_leaves_no_old_row_version_of_the_user_in_any_page(
    patient_engine: Engine, database_url: str, pg_schema: str
) -> None:
    """The projections replace a forgotten user's values by UPDATE: the old row versions, personal
    values in the clear, stay in the read models' pages (dead versions, then free space) after
    they catch up, readable from the tables' files (`sessions`, `workflow_states`, its user index,
    `workflow_executions`, `funnel_sessions`, as read with pageinspect). ``projections rebuild``
    builds new tables and drops the old ones: what docs/erasure.md tells the operator to run."""
    # Given a user forgotten after the projections had their values, and the projections caught up
    _alice_and_bob(patient_engine)
    projector = projector_for(patient_engine)
    projector.catch_up()
    assert patient_engine.forget(USER).keys_destroyed == 3
    projector.catch_up()
    # When the projections are rebuilt
    rebuild(projector)
    # Then no page of any relation of the schemas holds any of the user's values
    assert _pages_holding(database_url, pg_schema, {value: value.encode() for value in SECRETS}) == []
