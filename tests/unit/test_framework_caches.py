"""An app a test made, and its engine, are collected once the framework's caches are emptied
(``tests/support/framework_caches.py``, called between tests by ``tests/conftest.py``)."""

from __future__ import annotations

import gc
import weakref

from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.framework_caches import release_framework_caches


def _served_once() -> tuple[weakref.ref[object], weakref.ref[Engine]]:
    """An app over an in-memory engine that answered requests, both closed: weak references."""
    engine = Engine(settings=make_settings(database_url="memory:"))
    app = create_app(engine)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/openapi.json").status_code == 200
    engine.close()
    return weakref.ref(app), weakref.ref(engine)


def test_an_app_that_served_is_kept_by_the_frameworks_caches_until_they_are_emptied() -> None:
    release_framework_caches()
    app, engine = _served_once()
    gc.collect()
    # The framework's caches hold the app's callables, so the app and its engine stay
    kept = app() is not None
    release_framework_caches()
    gc.collect()
    # and once they are emptied both are collected
    assert (kept, app(), engine()) == (True, None, None)
