"""A background drop of a scratch database (``tests/support/databases.py``) that fails is
reported when the drops are waited for, at the end of the run, not lost with its thread.
(One that succeeds is not timed here: each makes the server checkpoint, seconds under load.)"""

from __future__ import annotations

import uuid

import pytest

from tests.support.databases import BackgroundDrops


def test_a_drop_that_fails_is_raised_by_wait(database_url: str) -> None:
    drops = BackgroundDrops()
    drops.drop(database_url, f"scratch_missing_{uuid.uuid4().hex[:12]}")
    with pytest.raises(AssertionError, match=r"scratch databases not dropped: .*scratch_missing_"):
        drops.wait()
