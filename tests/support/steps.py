"""What another worker leaves in a session while its model call runs (a pending, leased step),
and how a test sees a caller waiting for it."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.store import UnitOfWork


def start_elsewhere(
    engine: Engine,
    session_id: str,
    key: str,
    lease: timedelta = timedelta(seconds=30),
    *,
    model: str | None = None,
) -> None:
    """Record a StepStarted under ``key`` held by a worker named ``elsewhere`` for ``lease``
    (``model``: the model it asked for; None, as a step started before models were recorded)."""

    def start(uow: UnitOfWork) -> None:
        session = uow.find(engine.session_uuid(session_id))
        session.start_step(
            step="greet",
            input={},
            model=model,
            key=key,
            now=uow.now,
            lease_until=uow.now + lease,
            worker="elsewhere",
        )

    engine.store.write(session_id, start)


def first_poll(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once a caller waiting on ``engine`` for a pending step has read the session."""
    polled = threading.Event()
    sessions = engine.steps._sessions
    real_get = sessions.get

    def get(*args: Any, **kwargs: Any) -> Any:
        state = real_get(*args, **kwargs)
        polled.set()
        return state

    monkeypatch.setattr(sessions, "get", get)
    return polled
