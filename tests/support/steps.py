"""What another worker leaves in a session while its model call runs: a pending, leased step."""

from __future__ import annotations

from datetime import timedelta

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
