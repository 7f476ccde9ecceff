"""The suite's PostgreSQL URL (``database_url`` in ``tests/conftest.py``) sets its sessions to
commit without waiting for the WAL flush, and keeps options a URL names itself."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import NO_COMMIT_FLUSH, without_commit_flush


def test_a_session_on_the_suites_url_commits_without_waiting_for_the_flush(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row == ("off",)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h:5432/d", "postgresql://u@h:5432/d?options=-c%20synchronous_commit%3Doff"),
        (
            "postgresql://u@h/d?sslmode=disable",
            "postgresql://u@h/d?sslmode=disable&options=-c%20synchronous_commit%3Doff",
        ),
        ("host=h dbname=d", f"host=h dbname=d options='{NO_COMMIT_FLUSH}'"),
        ("postgresql://u@h/d?options=-c%20x%3D1", "postgresql://u@h/d?options=-c%20x%3D1"),
    ],
)
def test_the_option_is_added_to_either_form_of_url_and_never_over_the_urls_own(
    url: str, expected: str
) -> None:
    assert without_commit_flush(url) == expected
