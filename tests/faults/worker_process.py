"""A worker for the crash test: one ``process_step`` against a slow model, until it is killed.

Run as ``python worker_process.py DATABASE_URL SCHEMA LLM_BASE_URL SESSION KEY LEASE_S``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from flowledger.adapters.llm import build_engine
from flowledger.infrastructure import Settings


async def main(database_url: str, schema: str, base_url: str, session: str, key: str, lease_s: str) -> None:
    settings = Settings(
        home=Path("/nonexistent"),
        database_url=database_url,
        schema=schema,
        llm_base_url=base_url,
        llm_api_key="sk-faults-1",
        step_lease_s=float(lease_s),
    )
    engine = build_engine(settings=settings, client_options={"request_timeout_s": 30.0, "max_retries": 0})
    try:
        # The request test_worker_crash.PAYLOAD repeats (its ``s`` and ``n`` are what tally counts).
        payload = {"s": session, "n": key, "message": "hello"}
        await engine.process_step(session, "greet", payload, idempotency_key=key)
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
