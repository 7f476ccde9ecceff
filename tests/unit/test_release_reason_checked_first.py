"""A release's reason (and a requeue's who and why) is checked before the task's state, in the
library and on the command line as REST's body is: a blank reason for a waiting task was a 422
over REST but a 409 / exit 4 ("cannot release task 't1': it is pending ...") from the library
and ``tasks release``, so one mistake got two answers, and a caller fixing the state would then
meet the other."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

COMMANDS: dict[str, tuple[Callable[[Engine], object], str]] = {
    "release-blank-reason": (lambda e: e.release_task("t1", " "), "reason"),
    "requeue-blank-reason": (lambda e: e.requeue_task("t1", "lead", " "), "reason"),
    "requeue-blank-person": (lambda e: e.requeue_task("t1", " ", "retry"), "requested_by"),
    "release-long-reason": (lambda e: e.release_task("t1", "r" * 2001), "reason"),
}


def a_waiting_task(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], capacity=1)
    engine.create_task("t1", "Fix it", ["python"])


@pytest.mark.parametrize("name", list(COMMANDS), ids=list(COMMANDS))
def test_the_library_refuses_the_argument_before_the_state(engine: Engine, name: str) -> None:
    a_waiting_task(engine)
    command, field = COMMANDS[name]
    with pytest.raises(ValidationError) as refused:
        command(engine)
    assert refused.value.field == field
    assert len(engine.task_history("t1")) == 1


def test_the_command_line_release_says_so_in_one_line_exit_2(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        a_waiting_task(engine)
    released = run_cli(database_url, pg_schema, "tasks", "release", "t1", "--reason", " ")
    assert (released.returncode, released.stdout) == (2, "")
    assert released.stderr.startswith("error: reason: "), released.stderr
