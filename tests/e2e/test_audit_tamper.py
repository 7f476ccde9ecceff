"""Tampering with the database directly, as anyone with database access could: ``flowledger audit
verify`` names the stream and version of each change and exits non-zero."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain import LlmUsage
from flowledger.domain.errors import AuditError, StoredEventAltered
from flowledger.domain.task import task_uuid
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.checkpoints import AuditTrail, heads_root, pack_heads, unpack_heads
from flowledger.verify import event_hash, statement_bytes
from tests.conftest import make_settings
from tests.support.cli import run_cli

COMPLETED = "flowledger.domain.session:Session.Completed"


@dataclass
class Log:
    """A log with two sessions and a signed checkpoint, and SQL access to it."""

    url: str
    schema: str
    victim: UUID
    bystander: UUID

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(
                SQL(statement).format(
                    events=Identifier(self.schema, "flowledger_events"),
                    checkpoints=Identifier(self.schema, "flowledger_checkpoints"),
                ),
                params,
            )
            return cur.fetchall() if cur.description else []

    def payload(self, version: int) -> dict[str, Any]:
        ((state,),) = self.sql(
            "SELECT state FROM {events} WHERE originator_id = %s AND originator_version = %s",
            self.victim,
            version,
        )
        parsed: dict[str, Any] = json.loads(bytes(state))
        return parsed

    def set_payload(self, version: int, payload: dict[str, Any]) -> None:
        self.sql(
            "UPDATE {events} SET state = %s WHERE originator_id = %s AND originator_version = %s",
            json.dumps(payload, separators=(",", ":")).encode(),
            self.victim,
            version,
        )


@pytest.fixture
def log(database_url: str, pg_schema: str) -> Iterator[Log]:
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    usage = LlmUsage(input_tokens=400, output_tokens=60, cost_usd=Decimal("0.000197"))
    with Engine(settings=settings) as engine:
        for session in ("victim", "bystander"):
            engine.start_session(session, "cs", user_id="u-1")
            engine.record_step(session, "greet", input={"q": "hello"}, usage=usage)  # version 2
            engine.record_step(session, "answer", input={"q": "refund?"}, usage=usage)  # version 3
            engine.record_step(session, "bye", input={"q": "thanks"})  # version 4
            engine.complete_session(session, "done")  # version 5
        engine.audit.checkpoint()
        yield Log(database_url, pg_schema, engine.session_uuid("victim"), engine.session_uuid("bystander"))


def edit_cost(log: Log) -> None:
    payload = log.payload(2)
    assert payload["usage"]["_data_"]["cost_usd"]["_data_"] == "0.000197"
    payload["usage"]["_data_"]["cost_usd"]["_data_"] = "0.000001"
    log.set_payload(2, payload)


def edit_input(log: Log) -> None:
    payload = log.payload(3)
    payload["input"] = {"q": "no refund wanted"}
    log.set_payload(3, payload)


def delete_last(log: Log) -> None:
    log.sql("DELETE FROM {events} WHERE originator_id = %s AND originator_version = 5", log.victim)


def delete_middle(log: Log) -> None:
    log.sql("DELETE FROM {events} WHERE originator_id = %s AND originator_version = 3", log.victim)


def swap_payloads(log: Log) -> None:
    two, three = log.payload(2), log.payload(3)
    log.set_payload(2, three)
    log.set_payload(3, two)


def change_topic_to_completed(log: Log) -> None:
    log.sql(
        "UPDATE {events} SET topic = %s WHERE originator_id = %s AND originator_version = 3",
        COMPLETED,
        log.victim,
    )


def truncate_tail(log: Log) -> None:
    log.sql("DELETE FROM {events} WHERE originator_id = %s AND originator_version >= 3", log.victim)


def forge_next_event(log: Log) -> None:
    """Append version 6 with a correct public hash (the rule is public) and a made-up seal."""
    ((previous,),) = log.sql(
        "SELECT event_hash FROM {events} WHERE originator_id = %s AND originator_version = 5", log.victim
    )
    # A resolution as complete_session stores one: a string there is refused when read back
    resolution = {"resolution": "refunded"}
    state = json.dumps({"timestamp": log.payload(5)["timestamp"], "resolution": resolution}).encode()
    chained = event_hash(bytes(previous), str(log.victim), 6, COMPLETED, state)
    log.sql(
        "INSERT INTO {events} (originator_id, originator_version, topic, state, transaction_id, event_hash, "
        "event_mac) VALUES (%s, 6, %s, %s, pg_current_xact_id(), %s, %s)",
        log.victim,
        COMPLETED,
        state,
        chained,
        os.urandom(32),
    )


def edit_and_rehash(log: Log) -> None:
    """Edit version 3 and recompute every public hash after it: only the seals are missing."""
    edit_input(log)
    rows = log.sql(
        "SELECT originator_version, topic, state, event_hash FROM {events} WHERE originator_id = %s "
        "ORDER BY originator_version",
        log.victim,
    )
    previous = bytes(rows[1][3])
    for version, topic, state, _ in rows[2:]:
        previous = event_hash(previous, str(log.victim), version, topic, bytes(state))
        log.sql(
            "UPDATE {events} SET event_hash = %s WHERE originator_id = %s AND originator_version = %s",
            previous,
            log.victim,
            version,
        )


def swap_positions(log: Log) -> None:
    """Swap the notification ids of versions 3 and 4 (version 4 now comes first in the log)."""
    held = dict(
        log.sql(
            "SELECT originator_version, notification_id FROM {events} WHERE originator_id = %s"
            " AND originator_version IN (3, 4)",
            log.victim,
        )
    )
    move = "UPDATE {events} SET notification_id = %s WHERE originator_id = %s AND originator_version = %s"
    log.sql(move, -held[3], log.victim, 3)
    log.sql(move, held[3], log.victim, 4)
    log.sql(move, held[4], log.victim, 3)


def move_last_ahead(log: Log) -> None:
    """Move the victim's last event far ahead in the log, past any id the sequence issued: every
    hash still checks, and a follower that read it would skip every event appended after it."""
    log.sql(
        "UPDATE {events} SET notification_id = notification_id + 1000 WHERE originator_id = %s"
        " AND originator_version = 5",
        log.victim,
    )


TAMPERING: list[tuple[Callable[[Log], None], str, int, str]] = [
    # (the change, the finding's kind (stable, for scripts), its version, what its line says)
    (edit_cost, "altered", 2, "altered row: its topic or payload is not what was written"),
    (edit_input, "altered", 3, "altered row: its topic or payload is not what was written"),
    (delete_last, "deleted", 5, "dropped rows: version 5 deleted at the end (the checkpoint signed 5)"),
    (delete_middle, "deleted", 3, "dropped row: version 3 missing before version 4"),
    (swap_payloads, "altered", 2, "altered row: its topic or payload is not what was written"),
    (forge_next_event, "forged", 6, "its hash was computed without the chain key: a row inserted"),
    (change_topic_to_completed, "altered", 3, "altered row: its topic or payload is not what was written"),
    (truncate_tail, "deleted", 3, "dropped rows: version 3..5 deleted at the end"),
    (edit_and_rehash, "forged", 3, "altered row: altered in place and re-hashed without the chain key"),
    # (the next engine's start sets the sequence past the moved id, so the checkpoint names it)
    (move_last_ahead, "reordered", 5, "past the one checkpoint 1 signed (10), which signed it as the"),
]


READ_REFUSALS: list[tuple[Callable[[Log], None], int, str]] = [
    # (the change, the version a read names, what its line says)
    (edit_cost, 2, "is not what its chained hash was taken over"),
    (swap_payloads, 2, "is not what its chained hash was taken over"),
    (change_topic_to_completed, 3, "is not what its chained hash was taken over"),
    (edit_and_rehash, 3, "is not sealed with the chain key"),
    (forge_next_event, 6, "is not sealed with the chain key"),
]


@pytest.mark.parametrize(
    ("tamper", "version", "says"), READ_REFUSALS, ids=[t[0].__name__ for t in READ_REFUSALS]
)
def test_a_read_refuses_a_row_changed_in_the_database_instead_of_serving_it(
    log: Log, database_url: str, tamper: Callable[[Log], None], version: int, says: str
) -> None:
    """get_session, history and replay served what an edit stored: a step's cost changed from
    0.000197 to 0.000001 in the database read 0.000198 as the session's total (0.000394 written)
    and in its history, exit 0, until ``audit verify`` next ran; an edit re-hashed by the public
    rule, or a row inserted with a fitting hash, likewise."""
    # Given a change made in the database directly
    tamper(log)
    # When a fresh engine reads the session (its state, at the changed version, its history)
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        for read in (
            lambda: engine.get_session("victim"),
            lambda: engine.get_session("victim", version=version),
            lambda: engine.history("victim"),
        ):
            # Then each refuses, naming the stream and version
            with pytest.raises(StoredEventAltered) as raised:
                read()
            assert (raised.value.stream, raised.value.version) == (str(log.victim), version)
            assert says in str(raised.value)
        # And the untouched session still reads
        assert engine.get_session("bystander").totals.cost_usd == Decimal("0.000394")
    # And the command line says so in one line, exit 65
    for command in (("history", "victim"), ("replay", "victim")):
        result = run_cli(log.url, log.schema, *command)
        assert result.returncode == 65, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(
            f"error: a stored event was altered: stream {log.victim} version {version} "
        )
        assert "flowledger audit verify" in lines[0]


def test_an_untouched_log_verifies_and_prints_its_rate(log: Log) -> None:
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 0, result.stderr
    assert "10 events in 2 streams: ok" in result.stderr
    assert "events/s" in result.stderr
    assert "latest checkpoint: 1" in result.stderr


@pytest.mark.parametrize(
    ("tamper", "kind", "version", "says"), TAMPERING, ids=[t[0].__name__ for t in TAMPERING]
)
def test_audit_verify_names_the_stream_and_version_of_each_change(
    log: Log, tamper: Callable[[Log], None], kind: str, version: int, says: str
) -> None:
    # Given a change made in the database directly
    tamper(log)
    # When the log is verified
    result = run_cli(log.url, log.schema, "audit", "verify")
    # Then it exits non-zero, naming the kind of change, the stream (and its session) and the version
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert problems[0].startswith(f"problem: {kind}: stream {log.victim} (victim) version {version}:"), (
        problems
    )
    # And says plainly what was found (a row edited in place was "forged"; rows deleted "gone")
    assert says in problems[0], problems
    assert str(log.bystander) not in result.stderr


def test_audit_verify_names_rows_reordered_in_the_log(log: Log) -> None:
    # Given versions 3 and 4 of a session swapped in the log's order (notification ids exchanged)
    swap_positions(log)
    # When the log is verified
    result = run_cli(log.url, log.schema, "audit", "verify")
    # Then the structure check says version 3 is not before 4, and 3 comes after 4: reordered
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert len(problems) == 2, problems
    assert (
        f"({log.victim} v4): dropped row: expected version 3, and version 3 is not before it" in problems[0]
    )
    assert f"({log.victim} v3): reordered rows: version 3 comes after version 4 in the log" in problems[1]
    assert str(log.bystander) not in result.stderr


def test_a_session_verified_alone_names_its_rows_reordered_in_the_log(log: Log) -> None:
    # Given versions 3 and 4 of a session swapped in the log's order (every hash still fits)
    swap_positions(log)
    # When that session alone is verified
    result = run_cli(log.url, log.schema, "audit", "verify", "--session", "victim")
    # Then it exits 1 naming the stream, the version that comes too early and both positions
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"problem: reordered: stream {log.victim} (victim) version 4:"), problems
    assert "reordered rows: version 4 is at log position" in problems[0]
    # And the bystander, untouched, still verifies alone
    assert run_cli(log.url, log.schema, "audit", "verify", "--session", "bystander").returncode == 0


def test_a_session_verified_alone_whose_rows_were_all_deleted_is_named_deleted_not_unknown(log: Log) -> None:
    # Given every row of a session the checkpoint signed deleted in the database
    log.sql("DELETE FROM {events} WHERE originator_id = %s", log.victim)
    # When that session alone is verified
    result = run_cli(log.url, log.schema, "audit", "verify", "--session", "victim")
    # Then it is a deletion the checkpoint proves (exit 1), not "session 'victim' not found" (exit 3)
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert problems == [
        f"problem: deleted: stream {log.victim} version 1: dropped rows: the whole stream was deleted"
        " (the checkpoint signed versions 1..5)"
    ], result.stderr
    # And a session that never existed is still not found
    assert run_cli(log.url, log.schema, "audit", "verify", "--session", "nobody").returncode == 3


def test_one_session_and_only_what_follows_the_checkpoint_can_be_verified(log: Log) -> None:
    delete_last(log)
    alone = run_cli(log.url, log.schema, "audit", "verify", "--session", "victim")
    assert alone.returncode == 1
    assert f"deleted: stream {log.victim} (victim) version 5" in alone.stderr
    assert "session victim: 4 events in 1 streams" in alone.stderr
    since = run_cli(log.url, log.schema, "audit", "verify", "--since-checkpoint")
    assert since.returncode == 1
    assert f"deleted: stream {log.victim} (victim) version 5" in since.stderr
    clean = run_cli(log.url, log.schema, "audit", "verify", "--session", "bystander", "--since-checkpoint")
    assert clean.returncode == 0, clean.stderr


def test_a_signed_tail_deleted_then_written_over_before_the_next_checkpoint_is_named(
    log: Log, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the latest checkpoint's heads were compared: a signed last event deleted, its
    version written again by the application and a later checkpoint taken (engines take one
    every 5 minutes) left a chain that verified, and the deletion went unnoticed. (A checkpoint
    is now refused over such a head; a log signed by an engine from before that still verifies
    against every checkpoint's heads, so the refusal is lifted here as that engine did not have it.)"""
    monkeypatch.setattr(AuditTrail, "_refuse_rewritten", lambda *_: None)
    # Given a session written across checkpoints 2 and 3 as the application writes (no false alarm)
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        engine.start_session("ongoing", "cs")
        engine.audit.checkpoint()
        engine.record_step("ongoing", "greet")
        engine.audit.checkpoint()
    # And the victim's last event, signed by checkpoint 1, deleted in the database
    delete_last(log)
    # And the application writing that version again, then a fourth checkpoint signing it
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        engine.record_step("victim", "cheaper", input={"q": "again"})
        engine.record_step("ongoing", "answer")
        engine.audit.checkpoint()
    # When the log is verified (the whole of it, or the victim's session alone)
    for scope in ((), ("--session", "victim")):
        result = run_cli(log.url, log.schema, "audit", "verify", *scope)
        # Then version 5 is named, and nothing else: not what checkpoint 1 signed, exit 1
        assert result.returncode == 1, result.stderr
        problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
        assert problems == [
            f"problem: altered: stream {log.victim} (victim) version 5: broken head: checkpoint 1 signed"
            " version 5 with another hash (its rows were deleted or altered and written again since)"
        ], result.stderr
    # And the session written across checkpoints verifies alone
    assert run_cli(log.url, log.schema, "audit", "verify", "--session", "ongoing").returncode == 0


def test_a_checkpoint_or_export_over_a_row_inserted_with_a_fitting_public_hash_is_refused(
    log: Log, database_url: str, tmp_path: Path
) -> None:
    """A checkpoint signed the heads it found: a Completed event inserted by SQL with its public
    hash recomputed (the rule is public; only the seal was made up) was signed by the next
    checkpoint, and the bundle `audit export` took one for verified offline."""
    # Given a forged last event (version 6) whose public hash fits
    forge_next_event(log)
    # When a bundle of the session is exported, Then it is refused (exit 1), naming the row, no file
    out = tmp_path / "victim.jsonl"
    exported = run_cli(log.url, log.schema, "audit", "export", "--session", "victim", "--out", str(out))
    assert exported.returncode == 1, exported.stderr
    assert exported.stderr.strip().splitlines() == [
        f"error: checkpoint refused: stream {log.victim} version 6 is not sealed with the chain key (a row"
        " inserted, or altered and re-hashed, in the database; or sealed under another chain key); run"
        " flowledger audit verify"
    ]
    assert not out.exists()
    # And no engine signs over it either (engines take one every 5 minutes)
    settings = make_settings(database_url=database_url, schema=log.schema)
    with Engine(settings=settings) as engine, pytest.raises(AuditError, match="version 6 is not sealed"):
        engine.audit.checkpoint()
    # And verify still names it as inserted after what the checkpoint signed
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert f"forged: stream {log.victim} (victim) version 6: its hash was computed without" in result.stderr


def test_a_refused_export_leaves_the_bundle_already_at_its_path_as_it_was(log: Log, tmp_path: Path) -> None:
    """`audit export --out F` truncated F before exporting: an export refused after a row was
    forged left an empty file where the last good bundle of the session had been."""
    # Given a good bundle of the session at F
    out = tmp_path / "victim.jsonl"
    first = run_cli(log.url, log.schema, "audit", "export", "--session", "victim", "--out", str(out))
    assert first.returncode == 0, first.stderr
    kept = out.read_bytes()
    # When a later export to F is refused (a row forged since)
    forge_next_event(log)
    again = run_cli(log.url, log.schema, "audit", "export", "--session", "victim", "--out", str(out))
    assert again.returncode == 1, again.stderr
    # Then F holds the good bundle still, and nothing else was left beside it
    assert out.read_bytes() == kept
    assert [p.name for p in tmp_path.iterdir()] == ["victim.jsonl"]
    # And an export to a directory that does not exist names the file the user gave
    missing = tmp_path / "no-such-dir" / "b.jsonl"
    refused = run_cli(log.url, log.schema, "audit", "export", "--out", str(missing))
    assert refused.returncode == 74
    assert refused.stderr.strip().splitlines() == [f"error: {missing}: No such file or directory"]


def insert_checkpoint_over_the_rewritten_victim(log: Log) -> int:
    """Insert the next checkpoint row by SQL: its heads are the victim's rewritten head, its root
    fits them, its statement is the latest one's otherwise, its signature made up (no key needed)."""
    ((version, head),) = log.sql(
        "SELECT originator_version, event_hash FROM {events} WHERE originator_id = %s"
        " ORDER BY originator_version DESC LIMIT 1",
        log.victim,
    )
    stored = log.sql("SELECT seq, position, statement, heads FROM {checkpoints} ORDER BY seq")
    heads: dict[UUID, tuple[int, bytes]] = {}
    for _, _, _, packed in stored:
        heads.update(unpack_heads(bytes(packed)))
    delta = {log.victim: (version, bytes(head))}
    heads.update(delta)
    seq, position, statement, _ = stored[-1]
    forged = dict(json.loads(bytes(statement)), seq=seq + 1, root=heads_root(heads).hex())
    log.sql(
        "INSERT INTO {checkpoints} (seq, position, statement, signature, heads) VALUES (%s, %s, %s, %s, %s)",
        seq + 1,
        position,
        statement_bytes(forged),
        bytes(64),
        pack_heads(delta),
    )
    return int(seq) + 1


def test_a_checkpoint_row_inserted_in_the_database_is_not_built_on_and_no_rewritten_bundle_is_signed(
    log: Log, tmp_path: Path
) -> None:
    """With database access alone: a session's step input edited, its public hashes recomputed,
    and a checkpoint row inserted whose heads are the rewritten ones (signature made up). The
    next checkpoint (engines take one every 5 minutes) folded the stored heads without checking
    any signature, so it signed over the rewritten stream, and `audit export --session` wrote a
    bundle holding the edit that `python -m flowledger.verify` passed with the published key."""
    # Given the victim rewritten and an unsigned checkpoint row vouching for it
    edit_and_rehash(log)
    inserted = insert_checkpoint_over_the_rewritten_victim(log)
    settings = make_settings(
        database_url=log.url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("later", "cs")  # something for the next checkpoint to sign
        # When a checkpoint is taken
        with pytest.raises(
            AuditError, match=f"checkpoint refused: checkpoint {inserted}, the latest stored,"
        ):
            engine.audit.checkpoint()
    # Then the command and the export refuse too, one line each, and no bundle is written
    taken = run_cli(log.url, log.schema, "audit", "checkpoint")
    assert taken.returncode == 1, taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1, taken.stderr
    bundle = tmp_path / "victim.jsonl"
    exported = run_cli(log.url, log.schema, "audit", "export", "--session", "victim", "--out", str(bundle))
    assert exported.returncode == 1, exported.stderr
    assert f"checkpoint {inserted}" in exported.stderr
    assert not bundle.exists()
    assert log.sql("SELECT max(seq) FROM {checkpoints}") == [(inserted,)]


def test_a_checkpoint_row_whose_link_to_the_one_before_was_altered_is_not_built_on(log: Log) -> None:
    """The latest checkpoint validly signed vouches for the ones before it through their digests
    (each names the one before as ``previous``): a middle one altered in place breaks that."""
    settings = make_settings(
        database_url=log.url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("later", "cs")
        assert engine.audit.checkpoint().seq == 2
        log.sql(
            "UPDATE {checkpoints} SET statement = convert_to(replace(convert_from(statement, 'UTF8'),"
            " '\"streams\":2', '\"streams\":9'), 'UTF8') WHERE seq = 1"
        )
        engine.start_session("later-still", "cs")
        with pytest.raises(AuditError, match="checkpoint refused: checkpoint 2 does not follow checkpoint 1"):
            engine.audit.checkpoint()


def test_rows_moved_behind_the_signed_log_position_are_named_not_left_unsigned(log: Log) -> None:
    """A session appended after the checkpoint, its rows' notification ids then negated (before
    the first id the log's sequence issues): every hash and seal checks, the whole log's
    structure check reads from id 1, and the next checkpoint signs what was appended past the
    last one's position, so it never signed the session and a follower never read it; `audit
    verify` said ok (exit 0) before and after that checkpoint, so the session could then be
    deleted with no trace."""
    settings = make_settings(
        database_url=log.url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("hidden", "cs")
        engine.record_step("hidden", "greet", input={"q": "hello"})
        hidden = engine.session_uuid("hidden")
    # Given the session's rows moved before every position the checkpoint signed
    log.sql("UPDATE {events} SET notification_id = -notification_id WHERE originator_id = %s", hidden)
    # When the log is verified, after a checkpoint was taken over it too
    run_cli(log.url, log.schema, "audit", "checkpoint")
    result = run_cli(log.url, log.schema, "audit", "verify")
    # Then the session is named at its first version, as moved
    assert result.returncode == 1, result.stderr
    assert f"reordered: stream {hidden} (hidden) version 1: moved rows: version 1 is at log position" in (
        result.stderr
    )
    assert "which signed no version of this stream" in result.stderr
    assert "victim" not in result.stderr


@pytest.mark.parametrize("since_checkpoint", [True, False], ids=["since-checkpoint", "whole-log"])
def test_a_new_stream_moved_into_a_gap_behind_the_checkpoint_is_named_since_the_checkpoint_too(
    database_url: str, pg_schema: str, since_checkpoint: bool
) -> None:
    """A session appended after the checkpoint, its rows then moved into ids left unused before
    the checkpoint's position (appends rolled back leave such gaps): every hash and seal checks,
    and ``--since-checkpoint`` reads only the signed streams' heads and what follows the
    position, so it said ok (exit 0) where the whole log and ``--session`` name it."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    events = Identifier(pg_schema, "flowledger_events")
    with Engine(settings=settings) as engine:
        engine.start_session("signed", "cs")
        with psycopg.connect(database_url, autocommit=True) as conn:  # two appends rolled back
            conn.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, 'notification_id')) FROM generate_series(1, 2)",
                [f"{pg_schema}.flowledger_events"],
            )
        engine.record_step("signed", "greet")
        engine.audit.checkpoint()
        engine.start_session("hidden", "cs")
        engine.record_step("hidden", "greet")
        hidden = engine.session_uuid("hidden")
    # Given the new session's rows moved into the gap before the checkpoint's position
    with psycopg.connect(database_url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(SQL("SELECT notification_id FROM {} ORDER BY 1").format(events))]
        assert ids == [1, 4, 5, 6]
        conn.execute(
            SQL("UPDATE {} SET notification_id = notification_id - 3 WHERE originator_id = %s").format(
                events
            ),
            [hidden],
        )
    # When the log is verified
    result = run_cli(
        database_url, pg_schema, "audit", "verify", *(["--since-checkpoint"] if since_checkpoint else [])
    )
    # Then the session is named at its first version, as moved behind the checkpoint
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert f"reordered: stream {hidden} (hidden) version 1: moved rows: version 1 is at log position 2," in (
        result.stderr
    )
    assert "which signed no version of this stream" in result.stderr


def test_an_event_moved_behind_the_signed_log_position_is_named_at_its_version(log: Log) -> None:
    forge = make_settings(
        database_url=log.url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=forge) as engine:
        engine.start_session("other", "cs")
    ((last,),) = log.sql("SELECT max(notification_id) FROM {events}")
    log.sql(
        "UPDATE {events} SET notification_id = -1 WHERE notification_id = %s",
        last,
    )
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 1, result.stderr
    assert "version 1: moved rows: version 1 is at log position -1" in result.stderr


def test_a_row_moved_before_the_first_log_position_is_named_with_no_checkpoint_taken(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
        engine.record_step("s", "greet")
        moved = engine.session_uuid("s")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            SQL("UPDATE {} SET notification_id = -notification_id").format(
                Identifier(pg_schema, "flowledger_events")
            )
        )
    result = run_cli(database_url, pg_schema, "audit", "verify")
    assert result.returncode == 1, result.stderr
    assert (
        f"reordered: stream {moved} (s) version 2: moved rows: its log position -2 lies before the first"
        " one the log's sequence issues (1)"
    ) in result.stderr


def test_one_forged_row_is_not_blamed_on_the_chain_key(log: Log) -> None:
    """The wrong-key line counted streams whose first finding was forged: a session verified
    alone whose one inserted last row was forged was told "no event's seal checks under this
    chain key ... it is not the key the log was sealed with", though its other five checked."""
    forge_next_event(log)
    result = run_cli(log.url, log.schema, "audit", "verify", "--session", "victim")
    assert result.returncode == 1, result.stderr
    assert f"forged: stream {log.victim} (victim) version 6" in result.stderr
    assert "no event's seal checks under this chain key" not in result.stderr


def test_a_dropped_checkpoint_is_named(log: Log, database_url: str) -> None:
    # Given a second checkpoint after more events, then dropped with the events it covered
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        engine.start_session("late", "cs")
        engine.record_step("late", "greet")
        engine.audit.checkpoint()
        late = engine.session_uuid("late")
    log.sql("DELETE FROM {checkpoints} WHERE seq = 2")
    log.sql("DELETE FROM {events} WHERE originator_id = %s", late)
    # Then verify names the checkpoint known outside the database (the anchor file)
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 1
    assert "checkpoint: checkpoint 2 (log position 12" in result.stderr
    assert "is in the anchor file but not in the database: it was dropped" in result.stderr


def test_no_checkpoint_is_signed_over_the_newest_ones_deleted_with_what_they_signed(
    log: Log, database_url: str
) -> None:
    """Checkpoint 2 and the session it signed deleted in the database (the log rolled back to
    checkpoint 1): the next checkpoint signed the rolled-back log as a new checkpoint 2, a valid
    signature vouching for it (a bundle of it verified offline), though this host's anchor file
    held the checkpoint 2 that signed the deleted session."""
    settings = make_settings(
        database_url=database_url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("late", "cs")
        assert engine.audit.checkpoint().seq == 2
        late = engine.session_uuid("late")
        anchors = engine.audit.anchor_file
    # Given checkpoint 2 deleted with the session it signed
    log.sql("DELETE FROM {checkpoints} WHERE seq = 2")
    log.sql("DELETE FROM {events} WHERE originator_id = %s", late)
    # When a checkpoint is taken on this host (engines take one every 5 minutes)
    with Engine(settings=settings) as engine:
        engine.start_session("later", "cs")
        with pytest.raises(AuditError, match="checkpoint refused: checkpoint 2, anchored in") as refused:
            engine.audit.checkpoint()
        assert str(anchors) in str(refused.value)
    # Then none is signed, and the command says why in one line, exit 1
    taken = run_cli(log.url, log.schema, "audit", "checkpoint")
    assert taken.returncode == 1, taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1, taken.stderr
    assert "is not in the database" in taken.stderr
    assert log.sql("SELECT max(seq) FROM {checkpoints}") == [(1,)]


def test_a_damaged_local_anchor_file_is_said_and_the_next_checkpoint_starts_a_line(
    log: Log, database_url: str
) -> None:
    # Given this host's anchor file with its last line cut short (a crash mid-write, a hand edit)
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        anchors = engine.audit.anchor_file
        text = anchors.read_text()
        anchors.write_text(text[: len(text) - 20])
        # When verified, Then the file and line are named, one line, exit 1 (not a crash, 70)
        result = run_cli(log.url, log.schema, "audit", "verify")
        assert result.returncode == 1, result.stderr
        assert f"the anchor file {anchors}, line 1, is not JSON" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        # And a new checkpoint is written on a line of its own, not onto the torn one
        engine.start_session("later", "cs")
        engine.audit.checkpoint()
        lines = anchors.read_text().splitlines()
        assert json.loads(lines[-1])["statement"]["seq"] == 2
        # Once the torn line is removed by hand, the log verifies against the file again
        anchors.write_text(lines[-1] + "\n")
        assert run_cli(log.url, log.schema, "audit", "verify").returncode == 0


def test_a_checkpoint_that_no_longer_reads_is_named_altered_not_also_dropped(log: Log) -> None:
    """A checkpoint whose stored heads were damaged was named twice: "altered (it no longer
    reads)", and "is in the anchor file but not in the database: it was dropped", which it was not."""
    log.sql(
        "UPDATE {checkpoints} SET heads = overlay(heads placing '\\x00'::bytea from 5 for 1) WHERE seq = 1"
    )
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem: checkpoint")]
    assert len(problems) == 1, problems
    assert problems[0].startswith("problem: checkpoint: checkpoint 1 was altered (it no longer reads)")


def test_a_checkpoint_dropped_between_two_others_is_named(log: Log, database_url: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        for session in ("a", "b"):
            engine.start_session(session, "cs")
            engine.audit.checkpoint()
    log.sql("DELETE FROM {checkpoints} WHERE seq = 2")
    result = run_cli(log.url, log.schema, "audit", "verify", "--anchors", "/dev/null")
    assert result.returncode == 1
    assert "problem: checkpoint: checkpoint 2 was dropped from the database" in result.stderr
    # And checkpoint 3's heads, folded without checkpoint 2's, are not blamed on checkpoint 3
    assert "checkpoint 3: its stored stream heads were altered" not in result.stderr
    assert (
        "checkpoint 3: its stored stream heads do not match its signed root (a checkpoint before it was"
        in (result.stderr)
    )


def test_audit_chain_chains_events_stored_without_a_hash_and_says_from_where_the_chain_is_original(
    log: Log,
) -> None:
    # Given events stored without a hash (as a log from before the chain holds them)
    log.sql("UPDATE {events} SET event_hash = NULL, event_mac = NULL WHERE notification_id <= 4")
    unchained = run_cli(log.url, log.schema, "audit", "verify")
    assert unchained.returncode == 1
    assert "unchained: stream" in unchained.stderr
    # When they are chained
    chained = run_cli(log.url, log.schema, "audit", "chain")
    assert chained.returncode == 0, chained.stderr
    assert "chained 4 events of 1 streams, up to log position 4;" in chained.stderr
    # Then the log verifies, and says which part was chained after the fact
    verified = run_cli(log.url, log.schema, "audit", "verify")
    assert verified.returncode == 0, verified.stderr
    assert "events up to log position 4 were chained after they were written" in verified.stderr
    assert "already chained" in run_cli(log.url, log.schema, "audit", "chain").stderr


def test_audit_chain_does_not_seal_a_row_edited_with_its_hash_removed_nor_blame_the_row_after_it(
    log: Log,
) -> None:
    """An edited row whose hash and seal were removed is ``unchained``, and the line says ``audit
    chain`` chains such rows: it chained it, sealing the edit under the chain key, and ``audit
    verify`` then blamed version 4, never touched ('altered row: its topic or payload is not what
    was written'), where it had named version 3."""
    # Given version 3 edited in the database and its hash and seal removed (version 4 was
    # chained onto the hash of what version 3 held when it was written)
    edit_input(log)
    log.sql(
        "UPDATE {events} SET event_hash = NULL, event_mac = NULL WHERE originator_id = %s"
        " AND originator_version = 3",
        log.victim,
    )
    # When `audit chain` runs, as the finding's line suggests
    chained = run_cli(log.url, log.schema, "audit", "chain")
    # Then it refuses that stream, naming version 3 and why, and seals nothing of it
    assert chained.returncode == 1, chained.stderr
    assert f"stream {log.victim} version 3: not chained:" in chained.stderr
    assert "version 4 was chained onto" in chained.stderr
    stored = log.sql(
        "SELECT event_hash, event_mac FROM {events} WHERE originator_id = %s AND originator_version = 3",
        log.victim,
    )
    assert stored == [(None, None)]
    # And audit verify names version 3 still, not the row after it
    verified = run_cli(log.url, log.schema, "audit", "verify")
    assert verified.returncode == 1
    assert f"unchained: stream {log.victim} (victim) version 3:" in verified.stderr
    assert "version 4" not in verified.stderr


def test_audit_chain_chains_rows_an_engine_with_the_chain_off_appended_between_chained_ones(
    log: Log, database_url: str
) -> None:
    """The honest cause of unchained rows among chained ones (an engine with the chain off, then
    one with it on) is still chained: the run leads into the next row's stored hash."""
    settings = make_settings(
        database_url=database_url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings.with_overrides(audit_chain=False)) as off:
        off.start_session("later", "cs")
        off.record_step("later", "greet")
    with Engine(settings=settings) as on:
        on.record_step("later", "answer")
    chained = run_cli(log.url, log.schema, "audit", "chain")
    assert chained.returncode == 0, chained.stderr
    assert "chained 2 events of 1 streams" in chained.stderr
    verified = run_cli(log.url, log.schema, "audit", "verify")
    assert verified.returncode == 0, verified.stderr


def test_a_dropped_checkpoint_table_is_a_finding_not_a_database_error(log: Log, tmp_path: Path) -> None:
    """``DROP TABLE flowledger_checkpoints`` (every signed head gone at once) stopped ``audit
    verify`` with psycopg's 'error: relation "….flowledger_checkpoints" does not exist LINE 1:
    ... ^', naming no finding; ``audit export`` and every checkpoint an engine took likewise."""
    # Given the checkpoint table dropped in the database
    log.sql("DROP TABLE {checkpoints}")
    # When the log is verified, Then the table and the checkpoint the anchor file knows are named
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 1, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("problem:")]
    assert problems[0] == (
        f"problem: checkpoint: the checkpoint table {log.schema}.flowledger_checkpoints is missing: it was"
        " dropped in the database, with every checkpoint it held"
    ), result.stderr
    assert "checkpoint 1 (log position 10" in problems[1]
    assert "is in the anchor file but not in the database: it was dropped" in problems[1]
    assert "does not exist" not in result.stderr
    # And an export, which takes a checkpoint, says so in one line, exit 1, no file
    out = tmp_path / "victim.jsonl"
    exported = run_cli(log.url, log.schema, "audit", "export", "--session", "victim", "--out", str(out))
    assert exported.returncode == 1, exported.stderr
    assert exported.stderr.strip().splitlines() == [
        f"error: the checkpoint table {log.schema}.flowledger_checkpoints is missing: it was dropped in the"
        " database, with every checkpoint it held; run flowledger audit verify"
    ]
    assert not out.exists()


def test_a_retry_under_an_old_key_refuses_its_step_edited_in_the_database(
    database_url: str, pg_schema: str
) -> None:
    """A step past the session's recent window is found by its key in the database (a search,
    not a read of the stream): its output edited there was what a retry under the key was
    answered, though every read of the session refused the row."""
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=5)
    # Given a session whose first step (key k-0, version 2) is older than its recent steps
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
        engine.record_step("s", "quote", input={"q": "price?"}, output={"price": 10}, idempotency_key="k-0")
        for n in range(1, 26):
            engine.record_step("s", f"step-{n}", idempotency_key=f"k-{n}")
        stream = engine.session_uuid("s")
    # And its output edited in the database (a price of 10 made 1)
    log = Log(database_url, pg_schema, stream, stream)
    payload = log.payload(2)
    assert payload["output"] == {"price": 10}
    payload["output"] = {"price": 1}
    log.set_payload(2, payload)
    # When the step is retried under its key by a fresh engine
    with Engine(settings=settings) as engine, pytest.raises(StoredEventAltered) as raised:
        engine.record_step("s", "quote", input={"q": "price?"}, output={"price": 10}, idempotency_key="k-0")
    # Then the edited row is named, not answered
    assert (raised.value.stream, raised.value.version) == (str(stream), 2)


def test_a_budgets_ledger_row_edited_in_the_database_is_named(log: Log, database_url: str) -> None:
    """Enforcement reads the ledger table, not the Budget events: a limit raised from 5 to 1000,
    a mode turned to alert, a row deleted or inserted by SQL let calls spend past what
    ``budgets set`` recorded, and ``audit verify`` said ok (it read only the event log)."""
    # Given three budgets set as the application sets them
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        for subject in ("alice", "bob", "carol"):
            engine.budgets.set("user", subject, "day", "5")
        engine.budgets.set("user", "dave", "day", "5")
        engine.budgets.remove("user", "dave", "day")
    assert run_cli(log.url, log.schema, "audit", "verify").returncode == 0
    # When alice's limit and mode are edited, bob's row deleted and dave's put back by SQL
    budgets = Identifier(log.schema, "budgets")
    with psycopg.connect(log.url, autocommit=True) as conn:
        conn.execute(
            SQL("UPDATE {} SET limit_usd = 1000, mode = 'alert' WHERE subject = 'alice'").format(budgets)
        )
        conn.execute(SQL("DELETE FROM {} WHERE subject = 'bob'").format(budgets))
        conn.execute(
            SQL(
                "INSERT INTO {t} (budget_id, tenant, scope, subject, period, limit_usd, mode)"
                " SELECT gen_random_uuid(), tenant, scope, 'dave', period, 5, mode FROM {t}"
                " WHERE subject = 'carol'"
            ).format(t=budgets)
        )
    result = run_cli(log.url, log.schema, "audit", "verify")
    # Then each is named in one line, and the untouched carol is not: exit 1
    assert result.returncode == 1, result.stderr
    problems = sorted(line for line in result.stderr.splitlines() if line.startswith("problem: budget"))
    assert len(problems) == 3, result.stderr
    alice = next(p for p in problems if "user:alice/day" in p)
    assert (
        "its ledger row differs from its events: limit_usd 1000 (its events: 5), mode alert (its events:"
        in alice
    )
    assert any("user:bob/day" in p and "its ledger row is missing" in p for p in problems), problems
    assert any("its ledger row has no events (inserted in the database)" in p for p in problems), problems
    assert "carol" not in result.stderr


def test_a_task_edited_in_the_database_is_not_assigned_as_edited(database_url: str, pg_schema: str) -> None:
    """The assigner reads the batch's task streams with the agents' locks (one round trip) and
    decoded them unchecked: a task whose description was edited by SQL into "Wire money to X"
    was assigned as such (Task.Assigned appended after it, exit 0), though get_task refused it."""
    settings = make_settings(database_url=database_url, schema=pg_schema)
    # Given an agent and a waiting task, whose creation row is then edited in the database
    with Engine(settings=settings) as engine:
        engine.register_agent("be", "Backend", ["golang"], capacity=2)
        engine.create_task("t1", "Fix the Go worker", ["golang"])
        stream = task_uuid(engine.tenant, "t1")
    log = Log(database_url, pg_schema, stream, stream)
    payload = log.payload(1)
    payload["description"] = "Wire money to X"
    log.set_payload(1, payload)
    # When a fresh engine assigns it
    with Engine(settings=settings) as engine, pytest.raises(StoredEventAltered) as raised:
        engine.assign_task("t1")
    # Then the edited row is named, and nothing was appended to the task
    assert (raised.value.stream, raised.value.version) == (str(stream), 1)
    assert log.sql("SELECT count(*) FROM {events} WHERE originator_id = %s", stream) == [(1,)]


def test_the_task_index_passes_over_a_task_row_edited_in_the_database(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The task index folded its tail of ``Task.Created`` rows unchecked, while every read of a
    stream refused an edited row: a task's deadline edited into the past by SQL was what the
    overdue sweep went by, and the sweep then stopped at that task's checked load
    (StoredEventAltered), escalating none of the tenant's tasks that were really overdue."""
    settings = make_settings(database_url=database_url, schema=pg_schema)
    # Given a task due in a week, and another whose deadline has really passed
    with Engine(settings=settings) as engine:
        engine.create_task("later", "Fix the Go worker", ["golang"], deadline=timedelta(days=7))
        engine.create_task("due", "Fix the Rust worker", ["rust"], deadline=timedelta(seconds=5))
        stream = task_uuid(engine.tenant, "later")
    # And the first one's deadline edited into the past in its creation row
    log = Log(database_url, pg_schema, stream, stream)
    payload = log.payload(1)
    deadline = payload["deadline"]["_data_"]
    payload["deadline"]["_data_"] = "2001" + deadline[4:]
    log.set_payload(1, payload)
    # When a fresh engine sweeps the overdue tasks after the real deadline passed
    with Engine(settings=settings) as engine:
        swept = engine.escalate_overdue(datetime.now(UTC) + timedelta(minutes=1))
        # Then the task really overdue is escalated, and the edited one is not swept as the edit made it
        assert [state.task_id for state in swept] == ["due"]
        assert any(f"stream {stream} version 1" in r.getMessage() for r in caplog.records), caplog.text
        # And its own read still names the edited row
        with pytest.raises(StoredEventAltered) as raised:
            engine.get_task("later")
        assert (raised.value.stream, raised.value.version) == (str(stream), 1)
    assert log.sql("SELECT count(*) FROM {events} WHERE originator_id = %s", stream) == [(1,)]


def test_checkpoints_deleted_with_no_anchor_file_at_hand_are_not_called_proven(
    log: Log, database_url: str
) -> None:
    """Every checkpoint row deleted, with the victim's signed last event, and verified where no
    anchor file holds them (another host, ``--anchors`` of an empty file): ``audit verify`` said
    "10 events in 2 streams: ok", exit 0, beside a line that no checkpoint was there yet."""
    # Given every checkpoint deleted in the database, and the victim's last event with them
    log.sql("DELETE FROM {checkpoints}")
    delete_last(log)
    # When verified with no anchor file that knows them (an empty one, or this host's removed)
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        local = engine.audit.anchor_file
    for scope in (("--anchors", "/dev/null"), ()):
        if not scope:
            local.unlink()
        result = run_cli(log.url, log.schema, "audit", "verify", *scope)
        # Then it is not called ok: it says nothing signed proves it, and why, with what to do
        assert "9 events in 2 streams: no problems found, but not proven: no signed checkpoint" in (
            result.stderr
        ), result.stderr
        assert ": ok" not in result.stderr
        assert "or the checkpoint table's rows were deleted in the database" in result.stderr
    # And a checkpoint taken again makes it ok (what is there is proven from then on)
    assert run_cli(log.url, log.schema, "audit", "checkpoint").returncode == 0
    assert "9 events in 2 streams: ok" in run_cli(log.url, log.schema, "audit", "verify").stderr


def test_a_script_that_requires_proof_gets_exit_1_for_a_log_no_checkpoint_covers(
    log: Log, database_url: str
) -> None:
    """ "Not proven" exits 0, as a log whose first checkpoint is not taken yet does: a script that
    reads only the exit code took a log whose checkpoints were deleted for a proven one.
    ``--require-proof`` makes it exit 1, and 0 again once a checkpoint covers the log."""
    # Given every checkpoint deleted in the database, verified where no anchor file knows them
    log.sql("DELETE FROM {checkpoints}")
    # When a script verifies and requires proof
    unproven = run_cli(log.url, log.schema, "audit", "verify", "--anchors", "/dev/null", "--require-proof")
    # Then it fails, saying why
    assert unproven.returncode == 1, unproven.stderr
    assert "not proven: no signed checkpoint covers it" in unproven.stderr
    # And without the option the same log is still exit 0 (a log before its first checkpoint)
    assert run_cli(log.url, log.schema, "audit", "verify", "--anchors", "/dev/null").returncode == 0
    # And once a checkpoint covers the log, proof is there (this host's anchor file, which holds
    # the deleted checkpoint, removed: the new one has its number)
    with Engine(settings=make_settings(database_url=database_url, schema=log.schema)) as engine:
        engine.audit.anchor_file.unlink(missing_ok=True)
    assert run_cli(log.url, log.schema, "audit", "checkpoint").returncode == 0
    proven = run_cli(log.url, log.schema, "audit", "verify", "--require-proof")
    assert proven.returncode == 0, proven.stderr
    assert ": ok" in proven.stderr


def test_a_session_no_checkpoint_signed_yet_is_not_called_proven(log: Log, database_url: str) -> None:
    """A session written after the latest checkpoint: ``audit verify --session`` said "ok", exit 0,
    even with ``--require-proof``, though nothing signed says which events it held (its rows
    could be deleted unseen); and the whole log's "ok" did not say that some of it is unsigned."""
    settings = make_settings(
        database_url=database_url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("fresh", "cs")
        engine.record_step("fresh", "greet")
    # When the new session is verified, with and without --require-proof
    session = run_cli(log.url, log.schema, "audit", "verify", "--session", "fresh")
    required = run_cli(log.url, log.schema, "audit", "verify", "--session", "fresh", "--require-proof")
    # Then its one line says it is not proven, and a script that requires proof gets exit 1
    assert session.returncode == 0, session.stderr
    line = "session fresh: 2 events in 1 streams: no problems found, but not proven: no signed checkpoint"
    assert line in session.stderr, session.stderr
    assert ": ok" not in session.stderr
    assert required.returncode == 1, required.stderr
    # And the whole log is ok, saying how many of its events no checkpoint signed yet
    whole = run_cli(log.url, log.schema, "audit", "verify", "--require-proof")
    assert whole.returncode == 0, whole.stderr
    assert "12 events in 3 streams: ok, but 2 of them are not signed yet" in whole.stderr, whole.stderr
    # And once a checkpoint covers them, the session is proven and the log wholly signed
    assert run_cli(log.url, log.schema, "audit", "checkpoint").returncode == 0
    proven = run_cli(log.url, log.schema, "audit", "verify", "--session", "fresh", "--require-proof")
    assert proven.returncode == 0, proven.stderr
    assert "session fresh: 2 events in 1 streams: ok\n" in proven.stderr
    assert "12 events in 3 streams: ok\n" in run_cli(log.url, log.schema, "audit", "verify").stderr


@pytest.mark.parametrize("moved", [4, 8], ids=["a middle row", "the last row"])
def test_a_row_moved_past_the_sequence_is_still_named_after_the_sequence_is_set_forward(
    database_url: str, pg_schema: str, moved: int
) -> None:
    """A row's notification id set to one past the sequence's last value, with no checkpoint over
    it: the start of the next engine (``audit verify``'s own among them) set the sequence forward
    to the moved id with a warning, and the moved row then verified: `audit verify` said "no
    problems found" (exit 0) at once, since its own start had set the sequence forward. The
    repair now records each row it found past the sequence, and `audit verify` names it."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        for session in ("s1", "s2"):
            engine.start_session(session, "cs")
            for n in range(3):
                engine.record_step(session, "answer", input={"n": n})
        names = {1: ("s1", engine.session_uuid("s1")), 5: ("s2", engine.session_uuid("s2"))}
    with psycopg.connect(database_url, autocommit=True) as conn:
        events = Identifier(pg_schema, "flowledger_events")
        ((version,),) = conn.execute(
            SQL(
                "UPDATE {} SET notification_id = 9 WHERE notification_id = %s RETURNING originator_version"
            ).format(events),
            [moved],
        ).fetchall()
    name, stream = names[1 if moved < 5 else 5]
    # When an engine starts (its start sets the sequence forward), and the log is verified, twice
    with Engine(settings=settings) as engine:
        engine.record_step(name, "after")
    first = run_cli(database_url, pg_schema, "audit", "verify")
    again = run_cli(database_url, pg_schema, "audit", "verify")
    # Then each names the moved row's stream and version, as moved past the sequence
    for result in (first, again):
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert (
            f"reordered: stream {stream} ({name}) version {version}: moved rows: its log position 9 lay past"
            " the last one the log's sequence had issued (8) when it was set forward"
        ) in result.stderr, result.stderr


def test_two_streams_rows_swapped_in_the_log_are_named(log: Log) -> None:
    """The victim's last row and the bystander's first swap notification ids: each stream's
    versions stay in log order and every hash and seal checks, and the checkpoint signs heads,
    not positions; `audit verify` said ok, exit 0, though a follower that had read the victim's
    last row reads it again and never reads the bystander's first. Appends take their ids in the
    order of their transactions (the id section), so a row after one a later transaction wrote
    was moved."""
    ((victim_last,),) = log.sql(
        "SELECT notification_id FROM {events} WHERE originator_id = %s AND originator_version = 5", log.victim
    )
    ((bystander_first,),) = log.sql(
        "SELECT notification_id FROM {events} WHERE originator_id = %s AND originator_version = 1",
        log.bystander,
    )
    move = "UPDATE {events} SET notification_id = %s WHERE notification_id = %s"
    log.sql(move, -1, victim_last)
    log.sql(move, victim_last, bystander_first)
    log.sql(move, bystander_first, -1)
    alone = run_cli(log.url, log.schema, "audit", "verify", "--session", "victim")
    assert alone.returncode == 1, (alone.stdout, alone.stderr)
    assert f"reordered: stream {log.victim} (victim) version 5: moved rows:" in alone.stderr
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert (
        f"reordered: stream {log.victim} (victim) version 5: moved rows: its log position {bystander_first}"
        " is out of the order of the transactions that wrote the log"
    ) in result.stderr, result.stderr


def test_two_streams_rows_swapped_past_the_checkpoint_are_named_since_the_checkpoint(
    log: Log, database_url: str
) -> None:
    """The same swap between two sessions written after the latest checkpoint: the whole log
    named it, but `audit verify --since-checkpoint` (which had no transaction-order check) said
    ok, exit 0. It now checks the rows from the checkpoint's position on."""
    settings = make_settings(
        database_url=database_url, schema=log.schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        for session in ("late-a", "late-b"):
            engine.start_session(session, "cs", user_id="u-1")
            engine.record_step(session, "greet", input={"q": "hello"})  # version 2
        late_a, late_b = engine.session_uuid("late-a"), engine.session_uuid("late-b")
    ((a_last,),) = log.sql(
        "SELECT notification_id FROM {events} WHERE originator_id = %s AND originator_version = 2", late_a
    )
    ((b_first,),) = log.sql(
        "SELECT notification_id FROM {events} WHERE originator_id = %s AND originator_version = 1", late_b
    )
    move = "UPDATE {events} SET notification_id = %s WHERE notification_id = %s"
    log.sql(move, -1, a_last)
    log.sql(move, a_last, b_first)
    log.sql(move, b_first, -1)
    since = run_cli(log.url, log.schema, "audit", "verify", "--since-checkpoint")
    assert since.returncode == 1, (since.stdout, since.stderr)
    assert (
        f"reordered: stream {late_a} (late-a) version 2: moved rows: its log position {b_first}"
        " is out of the order of the transactions that wrote the log"
    ) in since.stderr, since.stderr
    assert f"reordered: stream {late_b} (late-b) version 1: moved rows:" in since.stderr
    # And one session since the checkpoint: its row moved is named too
    alone = run_cli(log.url, log.schema, "audit", "verify", "--session", "late-a", "--since-checkpoint")
    assert alone.returncode == 1, (alone.stdout, alone.stderr)
    assert f"reordered: stream {late_a} (late-a) version 2: moved rows:" in alone.stderr
    # And a log untouched after the checkpoint still verifies since it
    log.sql(move, -1, a_last)
    log.sql(move, a_last, b_first)
    log.sql(move, b_first, -1)
    clean = run_cli(log.url, log.schema, "audit", "verify", "--since-checkpoint")
    assert clean.returncode == 0, (clean.stdout, clean.stderr)


def test_a_row_whose_transaction_id_was_set_below_the_rows_before_it_is_named(log: Log) -> None:
    """Transaction ids compared as numbers: psycopg reads xid8 as text, so '5' sorted after
    '114822' and the bystander's last row, its transaction id set to 5, was passed over."""
    log.sql(
        "UPDATE {events} SET transaction_id = '5' WHERE originator_id = %s AND originator_version = 5",
        log.bystander,
    )
    result = run_cli(log.url, log.schema, "audit", "verify")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert f"reordered: stream {log.bystander} (bystander) version 5: moved rows:" in result.stderr


def test_the_last_row_moved_one_past_the_sequence_under_a_running_engine_is_named(
    database_url: str, pg_schema: str
) -> None:
    """The log's last row moved to the id the sequence hands out next, while an engine runs: its
    next append took that id, collided, and the repair found nothing past the sequence (the
    failed append had drawn it), so nothing was recorded and the sequence check saw an id it had
    issued: `audit verify` said "no problems found", exit 0."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, checkpoint_every_events=0, checkpoint_every_s=0
    )
    with Engine(settings=settings) as engine:
        engine.start_session("s1", "cs")
        engine.record_step("s1", "answer")
        stream = engine.session_uuid("s1")
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                SQL("UPDATE {} SET notification_id = 3 WHERE notification_id = 2").format(
                    Identifier(pg_schema, "flowledger_events")
                )
            )
        engine.start_session("s2", "cs")  # takes id 3, collides, mends the sequence, stores at 4
    result = run_cli(database_url, pg_schema, "audit", "verify")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert (
        f"reordered: stream {stream} (s1) version 2: moved rows: its log position 3 lay past the last one"
        " the log's sequence had issued (2)"
    ) in result.stderr, result.stderr
