"""``get_session(id, as_of=…)`` finds its version by a binary search over the stream's
stamps (``infrastructure/engine/version_at.py``), not by decoding the whole history."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import SessionNotFound, StoredEventMissing
from flowledger.infrastructure import Engine, Settings

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def longest_prefix(stamps: list[datetime], moment: datetime) -> int:
    """The last version of the longest prefix stamped at or before ``moment`` (the rule)."""
    version = 0
    for number, stamp in enumerate(stamps, start=1):
        if stamp > moment:
            break
        version = number
    return version


@settings(max_examples=40, deadline=None)
@given(
    moves=st.lists(st.sampled_from([0, 0, 1, 2, 7, 60, -30]), min_size=0, max_size=40),
    probes=st.lists(st.integers(min_value=-5, max_value=400), min_size=1, max_size=6),
)
def test_as_of_finds_the_longest_prefix_stamped_at_or_before_the_moment(
    moves: list[int], probes: list[int]
) -> None:
    # Given a session whose clock moves on, stands still or goes back between steps
    now = [T0]
    memory = Settings(database_url="memory:", home=Path("/nonexistent"))
    engine = Engine(settings=memory, clock=lambda: now[0])
    try:
        engine.start_session("s", "cs", ttl=timedelta(days=1))
        for seconds in moves:
            now[0] += timedelta(seconds=seconds)
            engine.record_step("s", "step")
        stamps = [entry.timestamp for entry in engine.history("s")]
        # When it is read as of moments around and between its stamps
        for offset in probes:
            moment = T0 + timedelta(seconds=offset)
            expected = longest_prefix(stamps, moment)
            # Then the version read is the longest prefix's, or "did not exist yet" before it began
            if expected == 0:
                with pytest.raises(SessionNotFound, match="did not exist yet"):
                    engine.get_session("s", as_of=moment)
            else:
                assert engine.get_session("s", as_of=moment).version == expected
    finally:
        engine.close()


def rows_read(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the stored events the engine's recorder returns from now on."""
    recorder = engine.log.recorder
    select = recorder.select_events
    count = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        found = select(*args, **kwargs)
        count[0] += len(found)
        return found

    monkeypatch.setattr(recorder, "select_events", counting)
    return count


@pytest.mark.postgres
def test_an_as_of_read_of_a_long_session_reads_a_few_events_more_than_a_read_at_its_version(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session of 300 steps, read by a fresh engine
    pg_engine.start_session("long", "cs")
    for n in range(300):
        pg_engine.record_step("long", f"step-{n}")
    middle = pg_engine.history("long")[150]
    with Engine(settings=pg_engine.settings) as fresh:
        count = rows_read(fresh, monkeypatch)
        # When it is read as of the middle step's moment, and at that step's version
        at_moment = fresh.get_session("long", as_of=middle.timestamp)
        by_moment, count[0] = count[0], 0
        at_version = fresh.get_session("long", version=at_moment.version)
        by_version = count[0]
    # Then both read the same state, the moment costing a binary search more (it decoded all 301)
    assert at_moment.version >= middle.version
    assert at_moment == at_version
    assert by_moment - by_version <= 2 * math.ceil(math.log2(301)) + 3, (by_moment, by_version)


@pytest.mark.postgres
def test_an_as_of_read_that_meets_a_deleted_row_names_it(pg_engine: Engine) -> None:
    # Given a 20-step session whose version 11 (where the search looks first) was deleted
    pg_engine.start_session("holed", "cs")
    for n in range(20):
        pg_engine.record_step("holed", f"step-{n}")
    stamps = [entry.timestamp for entry in pg_engine.history("holed")]
    stream = pg_engine.session_uuid("holed")
    with psycopg.connect(pg_engine.database_url, autocommit=True) as conn:
        conn.execute(
            SQL("DELETE FROM {} WHERE originator_id = %s AND originator_version = 11").format(
                Identifier(pg_engine.settings.schema, "flowledger_events")
            ),
            (stream,),
        )
    # When it is read as of a moment between its first and last stamps
    with Engine(settings=pg_engine.settings) as fresh, pytest.raises(StoredEventMissing) as raised:
        fresh.get_session("holed", as_of=stamps[4] + (stamps[5] - stamps[4]) / 2)
    # Then the missing row is named, as a read of the history names it
    assert raised.value.version == 11
    assert str(stream) in str(raised.value)
