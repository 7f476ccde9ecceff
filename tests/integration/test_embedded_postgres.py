"""With no database URL, the Engine starts an embedded PostgreSQL under FLOWLEDGER_HOME."""

from __future__ import annotations

from pathlib import Path

from flowledger.infrastructure import Engine, Settings


def test_an_engine_without_a_url_stores_events_in_an_embedded_postgres(tmp_path: Path) -> None:
    settings = Settings.from_env({"FLOWLEDGER_HOME": str(tmp_path)})
    with Engine(settings=settings) as engine:
        engine.start_session("s1", "cs")
        engine.record_step("s1", "greet")
        assert engine.database_url.startswith("postgresql://")
        assert str(tmp_path) in engine.database_url
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()

    with Engine(settings=settings) as reopened:
        assert reopened.get_session("s1").step_count == 1
