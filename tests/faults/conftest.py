"""Fixtures of the fault suite: private PostgreSQL clusters, a per-case report line."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.faults.server import PrivateServer, new_root


@pytest.fixture
def private_postgres() -> Iterator[Callable[..., PrivateServer]]:
    """A factory of started private clusters (``make(**postgresql_conf)``), all removed afterwards."""
    servers: list[PrivateServer] = []

    def make(**settings: str) -> PrivateServer:
        server = PrivateServer(new_root(), settings=settings)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.cleanup()


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print one summary line for the case, past pytest's output capture."""

    def emit(line: str) -> None:
        with capsys.disabled():
            print(f"\n[faults] {request.node.name}: {line}", flush=True)

    return emit
