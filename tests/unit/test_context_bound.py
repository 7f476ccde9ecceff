"""A session's context is state, in every snapshot: merged updates stay within ``MAX_JSON_BYTES``
whatever the session's length; an update past it is refused and appends nothing.

An outside probe (issue 11, bounded snapshots): 1,500 ``update_context`` calls, each a new key
of 1 KB, were all accepted, a 1.5 MB context carried by every later snapshot.
"""

from __future__ import annotations

import pytest

from flowledger.domain.bounds import MAX_JSON_BYTES
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine

CHUNK = "x" * 100_000


def _fill(engine: Engine, session_id: str) -> int:
    """Add keys of 100 kB until the next would pass the limit; how many went in."""
    added = 0
    while (added + 1) * (len(CHUNK) + 12) < MAX_JSON_BYTES - 1_000:
        engine.update_context(session_id, {f"k{added}": CHUNK})
        added += 1
    return added


def test_a_context_update_past_the_limit_is_refused_and_appends_nothing() -> None:
    # Given a session whose context is close to the limit
    engine = Engine.in_memory()
    engine.start_session("s", "cs")
    added = _fill(engine, "s")
    version = engine.get_session("s").version

    # When one more key would take it past the limit, by update_context or with a step
    with pytest.raises(ValidationError, match="context after the update"):
        engine.update_context("s", {"one-more": CHUNK})
    with pytest.raises(ValidationError, match="context after the update"):
        engine.record_step("s", "greet", input={}, output={}, context_update={"one-more": CHUNK})

    # Then nothing was appended, and the context holds what went in before
    state = engine.get_session("s")
    assert state.version == version
    assert len(state.context) == added
    # and replacing a key (the size stays) is still accepted
    engine.update_context("s", {"k0": "small"})
    assert engine.get_session("s").context["k0"] == "small"
