"""Caches of the web framework that keep every app a test made alive, emptied between tests.

FastAPI (0.163) classifies each endpoint and dependency callable once, in three
``functools.lru_cache`` of 4,096 entries each (``fastapi.dependencies.models``), keyed by the
callable: the keys hold the app's routes (its ``/docs`` closure holds the app), the app holds
its engine. In a full run each test process kept the last hundred or more apps the tests had
made alive, closed engines and all: 0.8-1.1 GB a process, 1.3-4.2 million objects that every
full garbage collection walks (the workers' full collections took 43, 57 and 107 s of a run
beside other work, single ones up to 5-10 s; 31-58 s with the caches emptied). An app serving
for the life of a process, as ``serve`` runs it, loses nothing to these caches.
"""

from __future__ import annotations

from fastapi.dependencies import models

CACHED = ("_is_gen_callable_cached", "_is_async_gen_callable_cached", "_is_coroutine_callable_cached")
"""The caches' names in ``fastapi.dependencies.models``."""


def release_framework_caches() -> None:
    """Empty the framework's caches of callables, so the apps they name can be collected.

    Raises AttributeError when the framework no longer has one of them: the names are
    private, and ``tests/unit/test_framework_caches.py`` is there to notice a rename."""
    for name in CACHED:
        getattr(models, name).cache_clear()
