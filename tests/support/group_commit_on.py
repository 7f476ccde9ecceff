"""A pytest plugin that runs tests with group commit on: ``pytest -p tests.support.group_commit_on``.

``docs/write-path.md`` keeps group commit opt-in until the suite has run with it on. With this
plugin every ``Settings`` built in the run has ``group_commit`` on unless the test names it
(``make_settings`` and the tests that build ``Settings`` themselves alike), and the CLI and
server subprocesses get ``FLOWLEDGER_GROUP_COMMIT=1``. Tests marked ``default_settings``
check the defaults themselves, so they are skipped.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from flowledger.infrastructure import settings

_build = settings.Settings.__init__


def _grouped(self: settings.Settings, *args: Any, **fields: Any) -> None:
    fields.setdefault("group_commit", True)
    _build(self, *args, **fields)


def pytest_configure(config: pytest.Config) -> None:
    """Turn group commit on for the run (this process and its subprocesses)."""
    os.environ["FLOWLEDGER_GROUP_COMMIT"] = "1"
    settings.Settings.__init__ = _grouped  # type: ignore[method-assign]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the tests of the defaults: this run changed one."""
    skip = pytest.mark.skip(reason="checks a default that tests.support.group_commit_on changes")
    for item in items:
        if item.get_closest_marker("default_settings") is not None:
            item.add_marker(skip)
