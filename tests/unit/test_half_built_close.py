"""A constructor that fails closes what it had opened before it raises.

Left to ``Application.__del__``, a half-built application's pool was closed wherever the
garbage collector happened to run: once, in CI, from inside one of the pool's own threads,
which pytest reported as an "Exception ignored in Application.__del__" blamed on a later test.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.postgres.database import library_env
from tests.conftest import make_settings


class _NoRecorder(FlowledgerApplication):
    """An application whose factory opens and whose recorder then fails (as a refused start)."""

    closes = 0

    def construct_factory(self, env: Any) -> Any:
        factory = super().construct_factory(env)
        opened_close = factory.close

        def counted_close() -> None:
            type(self).closes += 1
            opened_close()

        factory.close = counted_close  # type: ignore[method-assign]
        return factory

    def construct_recorder(self) -> Any:
        raise RuntimeError("the server refused the start")


def test_an_application_whose_recorder_fails_closes_its_factory_before_raising_and_only_once() -> None:
    env = library_env("memory:", schema="public", pool_size=1)
    # When the constructor fails after the factory opened
    with pytest.raises(RuntimeError, match="refused the start"):
        _NoRecorder(env)
    # Then the factory is already closed when the error arrives
    assert _NoRecorder.closes == 1
    # And the garbage collector's __del__ does not close it a second time
    gc.collect()
    assert _NoRecorder.closes == 1


def test_a_closed_application_is_not_closed_again_by_the_garbage_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closes: list[int] = []
    opened_close = FlowledgerApplication.close

    def counted(self: FlowledgerApplication) -> None:
        closes.append(1)
        opened_close(self)

    monkeypatch.setattr(FlowledgerApplication, "close", counted)
    app = FlowledgerApplication(library_env("memory:", schema="public", pool_size=1))
    app.close()
    del app
    gc.collect()
    assert closes == [1]


def test_an_engine_that_fails_after_opening_its_store_closes_the_store_before_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[FlowledgerApplication] = []
    opened_close = FlowledgerApplication.close

    def counted(self: FlowledgerApplication) -> None:
        closed.append(self)
        opened_close(self)

    def broken_chain(self: Engine) -> None:
        raise RuntimeError("the audit chain could not start")

    monkeypatch.setattr(FlowledgerApplication, "close", counted)
    monkeypatch.setattr(Engine, "_chain_events", broken_chain)
    # When the engine's constructor fails after its store opened
    closed_when_raised, message = -1, ""
    try:
        Engine(settings=make_settings(database_url="memory:"))
    except RuntimeError as error:
        message = str(error)
        closed_when_raised = len(closed)  # the traceback still holds the half-built engine
    assert "audit chain" in message
    # Then its application was closed before the error arrived, once
    assert closed_when_raised == 1
    gc.collect()
    assert len(closed) == 1
    assert closed[0].closed
