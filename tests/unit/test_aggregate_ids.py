"""Aggregate ids from the caller's ids: ``agent_uuid`` and ``task_uuid`` remember their answers
(an assignment asks for the same few many times), and what is not a name is still refused
with the field's name, never a TypeError from the cache."""

from __future__ import annotations

import pytest

from flowledger.domain.agent import agent_uuid
from flowledger.domain.errors import ValidationError
from flowledger.domain.task import task_uuid


@pytest.mark.parametrize("bad", [["t1"], "", "t\x00", 7])
def test_ids_are_still_checked_with_the_uuid_cache(bad: object) -> None:
    # agent_uuid / task_uuid remember their answers; what is not a name is still refused
    # with the field's name, never a TypeError from the cache.
    for make, field in ((task_uuid, "task_id"), (agent_uuid, "agent_id")):
        with pytest.raises(ValidationError, match=f"^{field}: "):
            make("default", bad)  # type: ignore[arg-type]
    assert task_uuid("default", "t1") == task_uuid("default", "t1")
    assert agent_uuid("default", "t1") != task_uuid("default", "t1")
