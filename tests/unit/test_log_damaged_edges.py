"""A log damaged as a whole (an events table dropped, a unique index that cannot be made again
over the rows stored without it) is the server's data, as a damaged row is: not the caller's
request (it was HTTP 400, the base FlowledgerError's status) nor any other error (exit 1)."""

from __future__ import annotations

from flowledger.adapters.cli.errors import exit_code_for
from flowledger.adapters.http.errors import status_for
from flowledger.domain.errors import LogDamaged


def test_a_log_damaged_as_a_whole_is_the_servers_data_over_http_and_on_the_command_line() -> None:
    damaged = LogDamaged("", 0, "s.flowledger_events is missing while s.flowledger_schema records version 8")
    assert status_for(damaged) == 500
    assert exit_code_for(damaged) == 65
