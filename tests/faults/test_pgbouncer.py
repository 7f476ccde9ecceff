"""Through PgBouncer in transaction-pooling mode (``FLOWLEDGER_PGBOUNCER=1``).

Two engines (as two servers would) and a follower reach a private cluster through a PgBouncer
of the test's own whose pool has 3 server connections, so consecutive transactions of one
client land on different backends. The append's id section (a session advisory lock taken
and released inside one statement), its marker lock and the horizon must stay right there,
nothing may be prepared on the server, and LISTEN (session state) cannot reach a listener,
so subscriptions poll. Checked: every step recorded once (duplicate deliveries with their
idempotency keys, concurrent steps on one session and on several), a live feed that skips
and repeats nothing, no advisory lock left behind, and the follower's read models equal a
rebuild, and the audit chain verifies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from eventsourcing.persistence import Notification

from flowledger.domain.errors import StoreRefused
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.projections import projector_for
from flowledger.projections.follow import follow
from flowledger.projections.rebuild import verify
from tests.conftest import make_settings
from tests.faults.pgbouncer import PgBouncer, require_pgbouncer
from tests.faults.server import PrivateServer, new_root

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SERVER_CONNECTIONS = 3
OWN_WRITERS = 6
OWN_SESSIONS = 4
"""Sessions each of the first writers works alone, each step delivered twice."""
STEPS = 20


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    """A private cluster behind a transaction-pooling PgBouncer."""
    require_pgbouncer()
    server = PrivateServer(new_root())
    pooler: PgBouncer | None = None
    try:
        server.start()
        pooler = PgBouncer(server, new_root(), pool_size=SERVER_CONNECTIONS)
        pooler.start()
        yield pooler
    finally:
        if pooler is not None:
            pooler.stop()
        server.cleanup()


def _steps(engine: Engine, session_id: str) -> list[tuple[str, str | None]]:
    return [(r.step, r.idempotency_key) for r in engine.session_steps(session_id)]


def test_through_transaction_pooling_every_step_is_recorded_once_and_the_feed_skips_nothing(
    bouncer: PgBouncer, report: Callable[[str], None]
) -> None:
    settings = make_settings(database_url=bouncer.url(), pgbouncer=True, schema="bounced", pool_size=8)
    direct = bouncer.server.url
    errors: list[BaseException] = []
    fed: list[int] = []
    stop, ready = threading.Event(), threading.Event()
    with (
        Engine(settings=settings) as first,
        Engine(settings=settings) as second,
        Engine(settings=settings) as reading,
    ):
        projector = projector_for(reading, batch_size=7)

        def following() -> None:
            try:
                follow(projector, stop=stop, ready=ready)
            except BaseException as error:
                errors.append(error)
                ready.set()

        follower = threading.Thread(target=following)
        follower.start()
        subscription = reading.log.recorder.subscribe(gt=0)

        def feed() -> None:
            item: Notification
            for item in subscription:
                fed.append(item.id)

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            assert ready.wait(20)
            assert errors == []
            first.start_session("shared", "cs")

            def own(engine: Engine, writer: int) -> None:
                for n in range(OWN_SESSIONS):
                    session = f"w{writer}-{n}"
                    engine.start_session(session, "cs")
                    for k in range(STEPS):
                        for _ in range(2):  # delivered twice: the key makes it one step
                            engine.record_step(session, f"s{k}", idempotency_key=f"{session}-{k}")

            def shared(engine: Engine, writer: int) -> None:
                for k in range(STEPS):
                    engine.record_step("shared", f"w{writer}-s{k}", idempotency_key=f"shared-{writer}-{k}")

            def run(work: Callable[[Engine, int], None], engine: Engine, writer: int) -> Callable[[], None]:
                def go() -> None:
                    try:
                        work(engine, writer)
                    except BaseException as error:
                        errors.append(error)

                return go

            engines = [first, second] * (OWN_WRITERS // 2)
            writers = [threading.Thread(target=run(own, e, w)) for w, e in enumerate(engines)]
            writers += [threading.Thread(target=run(shared, e, w)) for w, e in enumerate([first, second] * 2)]
            started = time.monotonic()
            for thread in writers:
                thread.start()
            for thread in writers:
                thread.join(timeout=60)
            elapsed = time.monotonic() - started
            assert errors == []
            with psycopg.connect(direct) as conn:
                stored = [
                    int(i)
                    for (i,) in conn.execute(
                        "SELECT notification_id FROM bounced.flowledger_events ORDER BY 1"
                    ).fetchall()
                ]
                # While the engines' pools hold their connections, the server sees at most the pool's
                backends = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid()"
                ).fetchone()
                clients = sum(e.log.recorder.datastore.pool.get_stats()["pool_size"] for e in (first, second))
            deadline = time.monotonic() + 20
            while len(fed) < len(stored) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            subscription.stop()
            feeder.join(timeout=10)
            stop.set()
            follower.join(timeout=20)
        assert errors == []  # the follower's too
        # Every step once: duplicates answered from their keys, concurrent steps on one session
        # all kept
        for w in range(OWN_WRITERS):
            for n in range(OWN_SESSIONS):
                session = f"w{w}-{n}"
                assert _steps(reading, session) == [(f"s{k}", f"{session}-{k}") for k in range(STEPS)]
        assert sorted(_steps(reading, "shared")) == sorted(
            (f"w{w}-s{k}", f"shared-{w}-{k}") for w in range(4) for k in range(STEPS)
        )
        # The live feed: every stored id once, in order
        assert fed == stored
        # The append's session lock never outlives its statement on a shared backend
        with psycopg.connect(direct) as conn:
            left = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
        assert left == (0,)
        assert backends is not None
        assert backends[0] <= SERVER_CONNECTIONS
        assert clients > SERVER_CONNECTIONS
        # The follower's read models (written through PgBouncer) equal a rebuild
        assert verify(projector) == []
        # And the audit chain, appended and checked through PgBouncer, holds
        chain = verify_chain(reading.audit)
        assert chain.findings == []
        assert chain.events == len(stored)
    steps = OWN_WRITERS * OWN_SESSIONS * STEPS + 4 * STEPS
    report(
        f"{steps} steps ({steps + OWN_WRITERS * OWN_SESSIONS * STEPS} deliveries) in {elapsed:.2f} s "
        f"from {clients} client connections over {backends[0]} server connections; "
        f"feed {len(fed)} = stored {len(stored)} events"
    )


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_an_engine_reached_through_pgbouncer_without_the_setting_is_refused_naming_it(
    bouncer: PgBouncer, pool_mode: str
) -> None:
    # Given PgBouncer in front of the server, and an engine not told so (FLOWLEDGER_PGBOUNCER
    # unset): its connections send startup options (the statement timeout) PgBouncer refuses,
    # in session pooling as in transaction pooling
    pooler = (
        bouncer if pool_mode == "transaction" else PgBouncer(bouncer.server, new_root(), pool_mode=pool_mode)
    )
    if pooler is not bouncer:
        pooler.start()
    try:
        # (the pool's wait, cut to the default 5 s: the refusal comes once it ends)
        settings = make_settings(
            database_url=pooler.url(), schema="not_told", pool_size=2, pool_timeout_s=5.0
        )
        # When it starts
        with pytest.raises(StoreRefused) as refused:
            Engine(settings=settings).close()
    finally:
        if pooler is not bouncer:
            pooler.stop()
    # Then it is refused at once in the project's error tree, naming the cause and the setting
    # (it raised the event library's bare OperationalError "couldn't get a connection after
    # 3.00 sec", which said neither), and the hint fits either mode (it said "in transaction
    # pooling mode" to an operator running session pooling)
    said = str(refused.value)
    assert "unsupported startup parameter" in said
    assert (
        "behind PgBouncer (in any pool_mode: it takes no startup options), set FLOWLEDGER_PGBOUNCER=1" in said
    )


def test_an_engine_reached_through_statement_pooling_is_refused_at_once_naming_the_mode(
    bouncer: PgBouncer,
) -> None:
    # Given a PgBouncer in statement-pooling mode, which refuses every transaction block
    statement = PgBouncer(bouncer.server, new_root(), pool_mode="statement")
    statement.start()
    try:
        settings = make_settings(
            database_url=statement.url(), schema="statement_mode", pgbouncer=True, operation_deadline_s=10
        )
        # When an engine starts through it
        started = time.monotonic()
        with pytest.raises(StoreRefused) as refused:
            Engine(settings=settings).close()
        elapsed = time.monotonic() - started
    finally:
        statement.stop()
    # Then it is refused at once, naming the mode and what works (it was StoreUnavailable
    # "transaction blocks not allowed in statement pooling mode (tried for 10.0 s)", exit 75)
    assert elapsed < 3.0, elapsed
    assert "statement pooling" in str(refused.value)
    assert "pool_mode = transaction" in str(refused.value)
