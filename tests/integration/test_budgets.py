"""Budgets on PostgreSQL through the simulator: enforced before the call, alerts once per window."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import psycopg
import pytest
from psycopg import sql

from flowledger.adapters.llm import (
    ApiKey,
    ClientConfig,
    OpenAICompatibleClient,
    WebhookNotifier,
    load_price_table,
)
from flowledger.adapters.llm.alerts import DELIVERY_HEADER, SIGNATURE_HEADER, verify
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.budget import Budget, CallScope, budget_uuid
from flowledger.domain.errors import (
    BudgetExceeded,
    BudgetLedgerDamaged,
    LlmCallFailed,
    StoreUnavailable,
    ValidationError,
)
from flowledger.domain.pricing import ModelPrice, PriceTable
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.budgets import PostgresBudgetLedger
from flowledger.infrastructure.postgres.database import create_schema
from flowledger.infrastructure.postgres.migrations import migrate
from flowledger.projections import dashboard, projector_for
from tests.support.clock import SetClock

pytestmark = pytest.mark.postgres
MODEL = "sim-pricey"
# A dear model, so that a handful of calls reach $1: ~100-token prompts, ~30-token replies.
PRICES = PriceTable(
    version="budget-test",
    prices={MODEL: ModelPrice(input_cost_per_token=Decimal("0.001"), output_cost_per_token=Decimal("0.002"))},
)


@pytest.fixture
def settings(database_url: str, pg_schema: str) -> Settings:
    return Settings(home=Path("/nonexistent"), database_url=database_url, schema=pg_schema)


@pytest.fixture
def simulator() -> Iterator[Any]:
    with run_simulator(SimulatorConfig(latency_ms=30, seed=5)) as running:
        yield running


def client(base_url: str, max_tokens: int = 64) -> OpenAICompatibleClient:
    config = ClientConfig(
        base_url=base_url, api_key=ApiKey("sk-budget-1"), default_model=MODEL, max_tokens=max_tokens
    )
    return OpenAICompatibleClient(config, prices=PRICES)


class Receiver:
    """A loopback webhook receiver that keeps every request's headers and body."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/budget"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


async def step(engine: Engine, session_id: str, n: int) -> str:
    try:
        await engine.process_step(session_id, f"s{n}", {"message": "refund please"}, idempotency_key=f"k{n}")
    except BudgetExceeded:
        return "refused"
    return "done"


def recorded_cost(engine: Engine, session_ids: list[str]) -> Decimal:
    total = Decimal(0)
    for session_id in session_ids:
        for entry in engine.history(session_id):
            usage = entry.data.get("usage")
            if usage is not None:
                total += usage.charged_usd
    return total


async def test_32_concurrent_calls_overshoot_a_1_dollar_budget_by_at_most_the_in_flight_estimate(
    settings: Settings, simulator: Any
) -> None:
    # Given two engines (two writers, as two processes would be) and a $1 tenant budget
    engines = [Engine(settings=settings, llm=client(simulator.base_url)) for _ in range(2)]
    engines[0].budgets.set("tenant", None, "day", "1", mode="enforce")
    # and an alert budget that the same calls cross at once, from two engines
    engines[1].budgets.set("workflow", "support", "day", "0.5", mode="alert")
    sessions = [f"burn-{i}" for i in range(32)]
    for session_id in sessions:
        engines[0].start_session(session_id, "support")
    estimate = client(simulator.base_url).max_cost(None, [{"role": "user", "content": "x" * 400}])
    try:
        # When 32 calls run at once, 16 through each engine
        outcomes = await asyncio.gather(
            *(step(engines[i % 2], session_id, i) for i, session_id in enumerate(sessions))
        )
        # Then some were refused, the spend stayed within the bound, and nothing is left held
        done, refused = outcomes.count("done"), outcomes.count("refused")
        assert done > 0, outcomes
        assert refused > 0, outcomes
        burn = next(b for b in engines[0].budgets.burn() if b.spec.scope == "tenant")
        assert burn.spent_usd == recorded_cost(engines[0], sessions)
        assert burn.spent_usd <= Decimal(1) + estimate.max_cost_usd
        assert burn.reserved_usd == 0
        assert engines[0].budgets._ledger is not None
        assert engines[0].budgets._ledger.open_reservations() == 0
        # Refused calls made no request: the simulator saw exactly the calls that were made
        assert simulator.stats["requests"] == done
        failures = [
            e.data["error_type"]
            for s in sessions
            for e in engines[0].history(s)
            if e.event_type.endswith("StepFailed")
        ]
        assert failures == ["budget_exceeded"] * refused
        # And the concurrent settlements raised each alert threshold exactly once
        alert_budget = budget_uuid(engines[0].tenant, "workflow", "support", "day")
        raised = [
            e.threshold for e in engines[0].store.events(alert_budget) if isinstance(e, Budget.AlertRaised)
        ]
        assert sorted(raised) == [50, 80, 100]
    finally:
        for engine in engines:
            await engine.aclose()


async def test_a_refused_call_sends_nothing_and_records_budget_exceeded(
    settings: Settings, simulator: Any
) -> None:
    engine = Engine(settings=settings, llm=client(simulator.base_url))
    try:
        engine.start_session("tiny", "support", user_id="alice")
        engine.budgets.set("user", "alice", "month", "0.01")
        with pytest.raises(BudgetExceeded) as refused:
            await engine.process_step("tiny", "greet", {"message": "hi"}, idempotency_key="g1")
        assert refused.value.limit_usd == Decimal("0.01")
        assert simulator.stats["requests"] == 0
        kinds = [e.event_type.rsplit(".", 1)[-1] for e in engine.history("tiny")]
        assert kinds[-1] == "StepFailed"
        assert engine.history("tiny")[-1].data["error_type"] == "budget_exceeded"
        # Another user's session, and a model budget on another model, do not apply
        engine.start_session("other", "support", user_id="bob")
        engine.budgets.set("model", "another-model", "day", "0.01")
        await engine.process_step("other", "greet", {"message": "hi"}, idempotency_key="g2")
        assert simulator.stats["requests"] == 1
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    "called_as", ["openai/sim-pricey", "sim-pricey-2026-04-14", "router/openai/sim-pricey"]
)
async def test_a_model_budget_holds_under_every_name_the_model_is_priced_by(
    settings: Settings, simulator: Any, called_as: str
) -> None:
    # Given a model budget on the price table's name, and a call under another name of it
    engine = Engine(settings=settings, llm=client(simulator.base_url))
    try:
        assert PRICES.resolve(called_as) == MODEL  # the same prices: the same model
        engine.start_session("s1", "support")
        engine.budgets.set("model", MODEL, "day", "0.000001")
        # Then the budget refuses it before the call, as under the table's own name
        with pytest.raises(BudgetExceeded):
            await engine.process_step("s1", "greet", {"message": "hi"}, model=called_as, idempotency_key="k1")
        assert simulator.stats["requests"] == 0
        # And what a call under an alias spends is the model's: it counts against the budget
        engine.budgets.set("model", MODEL, "day", "5")
        await engine.process_step("s1", "greet", {"message": "hi"}, model=called_as, idempotency_key="k2")
        [burn] = engine.budgets.burn()
        assert burn.spent_usd > 0
        assert burn.spent_usd == engine.get_session("s1").totals.cost_usd
    finally:
        await engine.aclose()


async def test_alerts_fire_once_per_threshold_per_window_with_signed_webhooks(
    settings: Settings, simulator: Any, receiver: Receiver
) -> None:
    clock = SetClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    notifier = WebhookNotifier(initial_wait_s=0.01, allow_private=True)  # the receiver is on loopback
    engine = Engine(settings=settings, llm=client(simulator.base_url), clock=clock, alerts=notifier)
    try:
        engine.start_session("alerting", "support")
        made = engine.budgets.set("workflow", "support", "day", "1", mode="alert", webhook_url=receiver.url)
        assert made.webhook_secret is not None
        # When calls go on well past the limit (alert mode refuses nothing) in one day
        for n in range(12):
            await engine.process_step(
                "alerting", f"s{n}", {"message": "refund please"}, idempotency_key=f"d1-{n}"
            )
        await notifier.drain()
        budget_id = budget_uuid(engine.tenant, "workflow", "support", "day")
        alerts = [e for e in engine.store.events(budget_id) if isinstance(e, Budget.AlertRaised)]
        # Then each threshold was raised once, and the spend went past 100 %
        assert [a.threshold for a in alerts] == [50, 80, 100]
        [burn] = engine.budgets.burn()
        assert burn.spent_usd > Decimal(1)
        # And the receiver got one signed request per alert
        assert len(receiver.requests) == 3
        for headers, body in receiver.requests:
            assert verify(made.webhook_secret, headers[SIGNATURE_HEADER], body)
            assert not verify("another-secret-of-some-length", headers[SIGNATURE_HEADER], body)
        assert len({headers[DELIVERY_HEADER] for headers, _ in receiver.requests}) == 3

        # When the next day's window starts, the thresholds fire again, once each
        clock.now += timedelta(days=1)
        engine.start_session("alerting-2", "support")
        for n in range(12):
            await engine.process_step(
                "alerting-2", f"s{n}", {"message": "refund please"}, idempotency_key=f"d2-{n}"
            )
        await notifier.drain()
        alerts = [e for e in engine.store.events(budget_id) if isinstance(e, Budget.AlertRaised)]
        assert [a.threshold for a in alerts] == [50, 80, 100, 50, 80, 100]
        assert len(receiver.requests) == 6
    finally:
        await engine.aclose()


async def test_a_lapsed_reservation_is_released_for_the_next_call(settings: Settings, simulator: Any) -> None:
    clock = SetClock(datetime(2026, 11, 30, 9, 0, tzinfo=UTC))
    engine = Engine(settings=settings, llm=client(simulator.base_url), clock=clock)
    try:
        engine.start_session("crash", "support")
        engine.budgets.set("session", "crash", "total", "0.5")
        ledger = engine.budgets._ledger
        assert ledger is not None
        scope_budget = budget_uuid(engine.tenant, "session", "crash", "total")
        # A worker holds $0.4 and dies (never settles)
        scope = CallScope(tenant=engine.tenant, session="crash", workflow="support", model=MODEL)
        assert engine.budgets.reserve(scope, Decimal("0.4")) is not None
        with pytest.raises(BudgetExceeded):
            engine.budgets.reserve(scope, Decimal("0.4"))
        # Once its hold lapsed, the budget's burn no longer counts it, though no call came since
        # (budgets list showed the dead hold as reserved until the next reservation on the window)
        clock.now += timedelta(seconds=engine.budgets.reservation_ttl_s + 1)
        [burn] = engine.budgets.burn()
        assert (burn.spent_usd, burn.reserved_usd) == (Decimal(0), Decimal(0))
        # And the next reservation releases it and is admitted
        assert engine.budgets.reserve(scope, Decimal("0.4")) is not None
        [burn] = engine.budgets.burn()
        assert burn.reserved_usd == Decimal("0.4")
        assert ledger.open_reservations([scope_budget]) == 1
    finally:
        await engine.aclose()


async def test_a_lost_workers_hold_is_taken_as_spent_at_its_estimate_once(settings: Settings) -> None:
    engine = Engine(settings=settings)
    try:
        engine.start_session("crash", "support")
        engine.budgets.set("session", "crash", "total", "1")
        # Given a worker that held $0.4 and was lost mid-call (its step is being taken over)
        scope = CallScope(tenant=engine.tenant, session="crash", workflow="support", model=MODEL)
        hold = uuid4()
        assert engine.budgets.reserve(scope, Decimal("0.4"), hold) is not None
        # When the taker takes its hold as spent, and once more (a repeat finds nothing held)
        engine.budgets.spend_lost(hold)
        engine.budgets.spend_lost(hold)
        engine.budgets.spend_lost(uuid4())  # no such hold
        # Then the call counts at its estimate, once, and nothing stays held
        [burn] = engine.budgets.burn()
        assert (burn.spent_usd, burn.reserved_usd) == (Decimal("0.4"), Decimal(0))
        assert engine.budgets._ledger is not None
        assert engine.budgets._ledger.open_reservations() == 0
    finally:
        engine.close()


def test_bad_budgets_are_refused_and_write_nothing(settings: Settings) -> None:
    engine = Engine(settings=settings)
    try:
        for args, kwargs in [
            (("user", "alice", "day", "-1"), {}),
            (("user", "alice", "day", "0"), {}),
            (("user", "alice", "day", 0.5), {}),
            (("user", "alice", "day", "NaN"), {}),
            (("user", "alice", "day", "1_000"), {}),  # Decimal reads these; a limit is plain digits
            (("user", "alice", "day", " 5 "), {}),
            (("user", "alice", "day", "1e3"), {}),
            (("user", "alice", "day", "\u0663"), {}),
            (("planet", "earth", "day", "1"), {}),
            (("user", "alice", "week", "1"), {}),
            (("user", "alice", "day", "1"), {"mode": "shout"}),
            (("user", "alice", "day", "1"), {"webhook_url": "ftp://x"}),
            (("user", None, "day", "1"), {}),
            (("tenant", "someone-else", "day", "1"), {}),
        ]:
            with pytest.raises(ValidationError):
                engine.budgets.set(*args, **kwargs)
        assert engine.budgets.burn() == []
        assert engine.log.head() == 0
    finally:
        engine.close()


async def test_calls_recorded_elsewhere_count_once_against_budgets_and_can_exhaust_them(
    settings: Settings, simulator: Any, receiver: Receiver
) -> None:
    notifier = WebhookNotifier(initial_wait_s=0.01, allow_private=True)  # the receiver is on loopback
    engine = Engine(settings=settings, llm=client(simulator.base_url), alerts=notifier)
    try:
        engine.start_session("elsewhere", "support", user_id="carol")
        engine.budgets.set("user", "carol", "day", "1")
        engine.budgets.set("workflow", "support", "day", "2", mode="alert", webhook_url=receiver.url)
        usage = LlmUsage(
            provider="x", request_model=MODEL, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.6")
        )
        # When a call made elsewhere is recorded, and recorded again under the same key
        engine.record_step("elsewhere", "a", usage=usage, idempotency_key="ext-1")
        engine.record_step("elsewhere", "a", usage=usage, idempotency_key="ext-1")
        spent = {b.spec.scope: b.spent_usd for b in engine.budgets.burn()}
        assert spent == {"user": Decimal("0.6"), "workflow": Decimal("0.6")}
        # Then a second one exhausts the user's budget: the next model call is refused unsent
        engine.record_step("elsewhere", "b", usage=usage, idempotency_key="ext-2")
        with pytest.raises(BudgetExceeded):
            await engine.process_step("elsewhere", "c", {"message": "hi"}, idempotency_key="c")
        assert simulator.stats["requests"] == 0
        # And the workflow's 50 % alert went out from synchronous code too
        await notifier.drain()
        assert len(receiver.requests) == 1
    finally:
        await engine.aclose()


async def test_steps_of_a_tenant_without_budgets_ask_the_ledger_once_then_skip_the_reservation(
    settings: Settings, simulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(settings=settings, llm=client(simulator.base_url))
    reservations: list[CallScope] = []
    reserve = engine.budgets.reserve

    def counted(scope: CallScope, estimate: Decimal, *args: Any) -> Any:
        reservations.append(scope)
        return reserve(scope, estimate, *args)

    monkeypatch.setattr(engine.budgets, "reserve", counted)
    try:
        engine.start_session("free", "support")
        # When five steps run on a tenant that has no budget
        for n in range(5):
            assert await step(engine, "free", n) == "done"
        # Then only the first asked the ledger: the others knew there was nothing to hold
        assert len(reservations) == 1
        # And a budget set here applies to the very next step
        engine.budgets.set("session", "free", "total", "0.000001")
        assert await step(engine, "free", 5) == "refused"
        assert len(reservations) == 2
    finally:
        await engine.aclose()


def test_migrate_makes_the_ledger_tables_and_a_ledger_on_an_unmigrated_schema_makes_them(
    database_url: str, pg_schema: str
) -> None:
    # Given a schema that migrate brought to the current version, and one made by hand
    migrate(database_url, pg_schema)
    bare = f"{pg_schema}_bare"
    create_schema(database_url, bare)
    with psycopg.connect(database_url) as conn:
        charges = f'"{pg_schema}".budget_charges'
        made = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [charges]).fetchone()
    assert made == (True,)
    for schema in (pg_schema, bare):
        ledger = PostgresBudgetLedger(database_url, schema)
        try:
            # When a ledger is first used, Then it works on both (the bare one made its tables)
            assert ledger.has_budgets("t1") is False
        finally:
            ledger.close()


async def test_a_model_without_a_price_is_called_and_flagged_when_configured_so_under_a_budget(
    settings: Settings, simulator: Any
) -> None:
    # Given a client that flags unpriced models instead of refusing them, and a tenant budget
    # (it raised UnknownModelPrice from the budget's estimate, after StepStarted: the step
    # stayed pending, the model was not called)
    config = ClientConfig(
        base_url=simulator.base_url,
        api_key=ApiKey("sk-budget-1"),
        default_model=MODEL,
        max_tokens=64,
        unpriced_models="flag",
    )
    engine = Engine(settings=settings, llm=OpenAICompatibleClient(config, prices=PRICES))
    try:
        engine.budgets.set("tenant", None, "day", "1", mode="enforce")
        engine.start_session("flagged", "support")
        # When a step calls a model the price table does not know
        record = await engine.process_step("flagged", "s1", {"message": "hi"}, model="mystery-model")
        # Then the call is made and its usage says it is unpriced; nothing is left pending
        assert record.usage is not None
        assert (record.usage.request_model, record.usage.unpriced) == ("mystery-model", True)
        assert engine.get_session("flagged").pending == ()
        ledger = engine.budgets._ledger
        assert ledger is not None
        assert ledger.open_reservations() == 0
    finally:
        await engine.aclose()


async def test_an_estimate_that_fails_leaves_a_step_failed_not_a_pending_step(
    settings: Settings, simulator: Any
) -> None:
    # Given an adapter whose cost estimate raises, under an enforced budget
    llm = client(simulator.base_url)

    def broken(model: str | None, messages: list[dict[str, Any]]) -> Any:
        raise RuntimeError("estimate broke")

    llm.max_cost = broken  # type: ignore[method-assign]
    engine = Engine(settings=settings, llm=llm)
    try:
        engine.budgets.set("tenant", None, "day", "1", mode="enforce")
        engine.start_session("estimating", "support")
        with pytest.raises(RuntimeError):
            await engine.process_step("estimating", "s1", {"message": "hi"})
        # Then the step that began is closed as failed, not left pending until its lease lapses
        state = engine.get_session("estimating")
        assert state.pending == ()
        assert [f.error_type for f in state.failures] == ["RuntimeError"]
    finally:
        await engine.aclose()


async def test_an_answer_without_usage_is_unpriced_and_counts_its_estimate_against_budgets(
    settings: Settings,
) -> None:
    # Given a provider (or a proxy) that leaves usage out of its answers, under a budget
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"id": "x", "model": MODEL, "choices": [{"message": {"content": "{}"}}]}
        )

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-budget-1"), default_model=MODEL)
    llm = OpenAICompatibleClient(config, prices=PRICES, transport=httpx.MockTransport(handler))
    engine = Engine(settings=settings, llm=llm)
    try:
        engine.budgets.set("tenant", None, "day", "10", mode="enforce")
        engine.start_session("silent", "support")
        # When a step calls it
        record = await engine.process_step("silent", "s1", {"message": "hi"})
        # Then its cost is not known (not a silent $0), and the budget counts the most it could cost
        assert record.usage is not None
        assert record.usage.unpriced is True
        assert record.usage.extra["usage_reported"] is False
        estimate = llm.max_cost(MODEL, [{"role": "user", "content": "x"}]).max_cost_usd
        [burn] = engine.budgets.burn()
        assert burn.spent_usd > estimate / 2
    finally:
        await engine.aclose()


def _recorded_holds(llm: OpenAICompatibleClient) -> list[Decimal]:
    """The holds ``llm`` estimates for its calls from now on, in order (its ``max_cost`` wrapped)."""
    held: list[Decimal] = []
    estimate = llm.max_cost

    def recording(model: str | None, messages: list[dict[str, Any]]) -> Any:
        made = estimate(model, messages)
        held.append(made.max_cost_usd)
        return made

    llm.max_cost = recording  # type: ignore[method-assign]
    return held


def _cut_stream(request: httpx.Request) -> httpx.Response:
    """A stream the provider began answering, cut before its usage chunk."""
    chunk = {"id": "x", "model": MODEL, "choices": [{"delta": {"content": '{"message": "h'}}]}
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, text=f"data: {json.dumps(chunk)}\n\n"
    )


def _lost_reply(request: httpx.Request) -> httpx.Response:
    """A request that went out (the provider has the prompt), whose reply never came."""
    raise httpx.ReadTimeout("no reply")


@pytest.mark.parametrize(
    ("handler", "stream", "error_type"),
    [(_cut_stream, True, "connection_error"), (_lost_reply, False, "timeout")],
    ids=["a stream cut before its usage chunk", "a reply lost after its request went out"],
)
async def test_a_call_billed_for_what_was_not_reported_is_unpriced_and_counts_its_estimate_against_budgets(
    settings: Settings, handler: Any, stream: bool, error_type: str
) -> None:
    # Given a provider whose answers are cut or lost before they say what they used, under a budget
    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-budget-1"),
        default_model=MODEL,
        stream=stream,
        max_retries=0,
    )
    llm = OpenAICompatibleClient(config, prices=PRICES, transport=httpx.MockTransport(handler))
    held = _recorded_holds(llm)
    engine = Engine(settings=settings, llm=llm)
    try:
        engine.budgets.set("tenant", None, "day", "10", mode="enforce")
        engine.start_session("cut", "support")
        # When a step's call fails on such an answer
        with pytest.raises(LlmCallFailed):
            await engine.process_step("cut", "s1", {"message": "hi"})
        # Then its StepFailed says the cost is not known (not a silent $0), and the budget
        # counts the most it could have cost, as it held
        [failure] = engine.get_session("cut").failures
        assert failure.usage is not None
        assert (failure.error_type, failure.usage.unpriced) == (error_type, True)
        [burn] = engine.budgets.burn()
        assert burn.spent_usd == held[0] > 0
        assert burn.reserved_usd == 0
    finally:
        await engine.aclose()


async def test_each_attempt_billed_for_what_was_not_reported_counts_its_estimate_against_budgets(
    settings: Settings,
) -> None:
    # Given a provider that cuts a stream twice before its usage chunk (each cut attempt billed
    # by the provider, for what is not known) and answers the third whole, under a budget
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) < 3:
            return _cut_stream(request)
        chunks = [
            {"id": "x", "model": MODEL, "choices": [{"delta": {"content": '{"message": "hi"}'}}]},
            {"id": "x", "model": MODEL, "choices": [{"delta": {}, "finish_reason": "stop"}]},
            {
                "id": "x",
                "model": MODEL,
                "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5},
            },
        ]
        text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)

    config = ClientConfig(
        base_url="https://llm.test/v1", api_key=ApiKey("sk-budget-1"), default_model=MODEL, stream=True
    )
    llm = OpenAICompatibleClient(config, prices=PRICES, transport=httpx.MockTransport(handler))
    held = _recorded_holds(llm)
    engine = Engine(settings=settings, llm=llm)
    try:
        engine.budgets.set("tenant", None, "day", "10", mode="enforce")
        engine.start_session("cut-twice", "support")
        # When a step's call is answered on its third attempt
        record = await engine.process_step("cut-twice", "s1", {"message": "hi"})
        # Then the answer's cost is known ($0.02: 10 x $0.001 + 5 x $0.002), the two cut attempts'
        # is not, and the budget counts the answer plus the most each cut attempt could have cost
        # (it counted one estimate for the whole call: two billed attempts were never counted)
        assert len(sent) == 3
        assert record.usage is not None
        assert (record.usage.cost_usd, record.usage.unpriced) == (Decimal("0.020"), True)
        [burn] = engine.budgets.burn()
        assert burn.spent_usd == Decimal("0.020") + 2 * held[0]
        assert burn.reserved_usd == 0
    finally:
        await engine.aclose()


def test_a_recorded_step_whose_charge_waits_for_the_ledger_is_returned_and_charged_later(
    settings: Settings,
) -> None:
    # (An outside probe, the ledger's windows locked by another session, 2 s deadline:
    # record_step raised StoreUnavailable ("budgets: canceling statement") with
    # outcome_unknown false, after its step was stored; the step's cost was never charged,
    # and a retry without a key would have stored the step twice.)
    engine = Engine(settings=settings.with_overrides(operation_deadline_s=1.0))
    holder = psycopg.connect(settings.database_url or "")
    try:
        engine.start_session("ledger-away", "support")
        engine.budgets.set("tenant", None, "day", "10")
        usage = LlmUsage(
            provider="x", request_model=MODEL, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.5")
        )
        engine.record_step("ledger-away", "a", usage=usage)
        # When the ledger cannot be written (its windows locked elsewhere) as a step is recorded
        holder.execute(
            psycopg.sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                psycopg.sql.Identifier(settings.schema, "budget_windows")
            )
        )
        record = engine.record_step("ledger-away", "b", usage=usage)
        # Then the call returns the stored step
        assert record.step == "b"
        assert engine.get_session("ledger-away").step_count == 2
        # And once the ledger is back, the step's cost is charged, once
        holder.rollback()
        spent = Decimal(0)
        for _ in range(100):
            (burn,) = engine.budgets.burn()
            spent = burn.spent_usd
            if spent == Decimal("1.0"):
                break
            time.sleep(0.05)
        assert spent == Decimal("1.0")
    finally:
        holder.close()
        engine.close()


CJK_MESSAGE = "我的订单什么时候到" * 1_000
"""9,000 Chinese characters: an OpenAI tokenizer makes a token or more of each."""


async def test_a_prompt_in_a_script_of_many_tokens_a_character_is_refused_by_a_budget_it_would_pass(
    settings: Settings,
) -> None:
    # Given an endpoint that bills a token a character, as OpenAI's tokenizers do for Chinese
    requests: list[httpx.Request] = []

    def billed(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        prompt = sum(len(m["content"]) for m in json.loads(request.content)["messages"])
        usage = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
        choice = {"index": 0, "message": {"role": "assistant", "content": "{}"}, "finish_reason": "stop"}
        return httpx.Response(200, json={"id": "c", "model": MODEL, "choices": [choice], "usage": usage})

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-budget-1"), default_model=MODEL)
    llm = OpenAICompatibleClient(config, prices=PRICES, transport=httpx.MockTransport(billed))
    engine = Engine(settings=settings, llm=llm)
    try:
        # And a budget the call would pass: 9,000 prompt tokens cost $9 at $0.001 a token
        engine.start_session("zh", "support", user_id="li")
        engine.budgets.set("user", "li", "month", "5")
        # When a step sends the 9,000 characters
        with pytest.raises(BudgetExceeded):
            await engine.process_step("zh", "greet", {"message": CJK_MESSAGE}, idempotency_key="k")
        # Then it is refused before the call: the estimate took four characters a token, held
        # $4.30 (2,250 tokens and the 1,024-token reply cap) and the call spent $9.3
        assert requests == []
        [burn] = engine.budgets.burn()
        assert (burn.spent_usd, burn.reserved_usd) == (Decimal(0), Decimal(0))
    finally:
        await engine.aclose()


async def test_a_call_recorded_under_a_dated_release_counts_against_its_models_budget(
    settings: Settings,
) -> None:
    # Given an engine whose adapter prices with the shipped table, and a $1 budget on gpt-4.1
    config = ClientConfig(
        base_url="https://llm.test/v1", api_key=ApiKey("sk-budget-1"), default_model="gpt-4.1"
    )
    llm = OpenAICompatibleClient(config, prices=load_price_table())
    engine = Engine(settings=settings, llm=llm)
    try:
        engine.start_session("made-elsewhere", "support")
        engine.budgets.set("model", "gpt-4.1", "day", "1")
        # When a call made elsewhere is recorded as OpenAI answers it: asked for openai/gpt-4.1,
        # answered by the dated release
        usage = LlmUsage(
            provider="openai",
            request_model="openai/gpt-4.1",
            response_model="gpt-4.1-2025-04-14",
            input_tokens=10,
            output_tokens=5,
            cost_usd=Decimal("0.6"),
        )
        engine.record_step("made-elsewhere", "a", usage=usage, idempotency_key="ext-1")
        # Then the model's budget counts it, as it counts a call process_step makes under
        # either name (it stayed at $0: the charge looked for a budget on the dated name)
        spent = Decimal(0)
        for _ in range(100):
            [burn] = engine.budgets.burn()
            spent = burn.spent_usd
            if spent:
                break
            time.sleep(0.05)
        assert spent == Decimal("0.6")
    finally:
        await engine.aclose()


async def test_a_budget_removed_and_set_again_records_each_alert_it_sends_again(
    settings: Settings, receiver: Receiver
) -> None:
    notifier = WebhookNotifier(initial_wait_s=0.01, allow_private=True)  # the receiver is on loopback
    engine = Engine(settings=settings, alerts=notifier)
    try:
        engine.start_session("twice", "support")
        usage = LlmUsage(
            provider="x", request_model=MODEL, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.6")
        )
        budget_id = budget_uuid(engine.tenant, "tenant", engine.tenant, "day")

        def alerts() -> list[int]:
            return [e.threshold for e in engine.store.events(budget_id) if isinstance(e, Budget.AlertRaised)]

        # Given an alert budget whose 50 % alert went out
        engine.budgets.set("tenant", None, "day", "1", mode="alert", webhook_url=receiver.url)
        engine.record_step("twice", "a", usage=usage, idempotency_key="a")
        await notifier.drain()
        assert (alerts(), len(receiver.requests)) == ([50], 1)
        # When it is removed and set again the same day (its spend starts from zero)
        engine.budgets.remove("tenant", None, "day")
        engine.budgets.set("tenant", None, "day", "1", mode="alert", webhook_url=receiver.url)
        engine.record_step("twice", "b", usage=usage, idempotency_key="b")
        await notifier.drain()
        # Then the alert it sends again is recorded again: the webhook went out while the
        # aggregate, remembering the removed budget's window, refused the event
        assert len(receiver.requests) == 2
        assert alerts() == [50, 50]
    finally:
        await engine.aclose()


async def test_a_limit_raised_within_a_window_alerts_at_the_new_limits_thresholds(settings: Settings) -> None:
    engine = Engine(settings=settings)
    try:
        engine.start_session("raised", "support")
        budget_id = budget_uuid(engine.tenant, "tenant", engine.tenant, "day")

        def spend(step: str, cost: str) -> None:
            usage = LlmUsage(
                provider="x", request_model=MODEL, input_tokens=1, output_tokens=1, cost_usd=Decimal(cost)
            )
            engine.record_step("raised", step, usage=usage, idempotency_key=step)

        def alerts() -> list[tuple[int, Decimal]]:
            return [
                (e.threshold, e.limit_usd)
                for e in engine.store.events(budget_id)
                if isinstance(e, Budget.AlertRaised)
            ]

        # Given a $1 alert budget that raised its 50 % alert at $0.60
        engine.budgets.set("tenant", None, "day", "1", mode="alert")
        spend("a", "0.6")
        assert alerts() == [(50, Decimal(1))]
        # When the owner raises the limit to $10 and the day's spend reaches $5.10
        engine.budgets.set("tenant", None, "day", "10", mode="alert")
        spend("b", "4.5")
        # Then 50 % of the new limit is raised: the window remembered the old limit's 50 %
        # and raised nothing for the rest of the day
        assert alerts() == [(50, Decimal(1)), (50, Decimal(10))]
        # And lowered back to $1, the thresholds the spend now passes are raised at the next call
        engine.budgets.set("tenant", None, "day", "1", mode="alert")
        spend("c", "0.01")
        assert [t for t, _ in alerts()] == [50, 50, 80, 100]
    finally:
        await engine.aclose()


def test_a_recorded_steps_charge_that_lands_after_midnight_counts_in_the_day_it_was_recorded(
    settings: Settings,
) -> None:
    # Given a day budget, a minute before midnight (UTC), and its ledger locked by another session
    clock = SetClock(datetime(2026, 11, 30, 23, 59, 30, tzinfo=UTC))
    engine = Engine(settings=settings.with_overrides(operation_deadline_s=1.0), clock=clock)
    holder = psycopg.connect(settings.database_url or "")
    windows = psycopg.sql.Identifier(settings.schema, "budget_windows")
    try:
        engine.start_session("late", "support")
        engine.budgets.set("tenant", None, "day", "10")
        usage = LlmUsage(
            provider="x", request_model=MODEL, input_tokens=1, output_tokens=1, cost_usd=Decimal("0.5")
        )
        engine.record_step("late", "a", usage=usage)
        holder.execute(psycopg.sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(windows))
        # When a step is recorded at 23:59:30 and its charge lands after midnight
        record = engine.record_step("late", "b", usage=usage)
        assert record.recorded_at.day == 30
        clock.now += timedelta(minutes=1)
        holder.rollback()
        charged = 0
        for _ in range(100):
            row = holder.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {}").format(
                    psycopg.sql.Identifier(settings.schema, "budget_charges")
                )
            ).fetchone()
            holder.rollback()
            charged = row[0] if row else 0
            if charged == 2:
                break
            time.sleep(0.05)
        assert charged == 2
        # Then the day it was recorded counts it, not the next (its window was taken from the
        # clock when the charge landed: 2026-12-01 spent $0.50 of a call made on 30 November)
        spent = dict(
            holder.execute(
                psycopg.sql.SQL("SELECT window_start::date::text, spent_usd FROM {}").format(windows)
            ).fetchall()
        )
        assert spent == {"2026-11-30": Decimal("1.0")}
    finally:
        holder.close()
        engine.close()


async def test_a_model_budget_on_a_name_calls_are_not_charged_as_is_refused_naming_the_one_they_are(
    settings: Settings, simulator: Any
) -> None:
    engine = Engine(settings=settings, llm=client(simulator.base_url))
    try:
        engine.start_session("prefixed", "support")
        # When a budget is set on the name the caller's code uses, with a provider prefix
        with pytest.raises(ValidationError) as refused:
            engine.budgets.set("model", f"openrouter/{MODEL}", "day", "0.000001")
        # Then it is refused, naming the price table's name: accepted, it never held, and a
        # call to openrouter/sim-pricey went through a $0.000001 budget
        assert refused.value.field == "subject"
        assert f"set it on '{MODEL}'" in refused.value.message
        assert engine.budgets.burn() == []
        await engine.process_step("prefixed", "s1", {"message": "hi"}, model=f"openrouter/{MODEL}")
        # And the table's name is accepted and holds for the prefixed calls
        engine.budgets.set("model", MODEL, "day", "0.000001")
        with pytest.raises(BudgetExceeded):
            await engine.process_step("prefixed", "s2", {"message": "hi"}, model=f"openrouter/{MODEL}")
    finally:
        await engine.aclose()


def _held_ledger_writes(engine: Engine, method: str) -> tuple[threading.Event, threading.Event]:
    """Make ``engine``'s next ledger ``method`` (put, delete) wait until released: a process
    whose budget's event is stored and whose ledger write is slow (a network pause)."""
    ledger: Any = engine.budgets._ledger
    original = getattr(ledger, method)
    waiting, release = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        waiting.set()
        assert release.wait(30)
        return original(*args, **kwargs)

    setattr(ledger, method, held)
    return waiting, release


def _waiting_on_a_lock(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether a statement on ``schema``'s tables is waiting for a lock."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position(%s in query) > 0",
        [f'"{schema}".'],
    ).fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("write", ["reserve", "charge"])
def test_a_reservation_or_charge_racing_its_budgets_removal_finds_it_gone_not_a_foreign_key_error(
    settings: Settings, write: str
) -> None:
    """Two servers removing a budget while calls run: a call that read the budget before the
    removal committed wrote its window after, and failed the foreign key (its step failed as
    ``ForeignKeyViolation``, HTTP 500; a stored step's charge likewise)."""
    engine = Engine(settings=settings)
    ledger = PostgresBudgetLedger(settings.database_url or "", settings.schema, settings)
    remover = psycopg.connect(settings.database_url or "")
    try:
        engine.budgets.set("workflow", "support", "day", "10")
        scope = CallScope(tenant=engine.tenant, session="s1", workflow="support", model=MODEL)
        # Given the budget's removal written but not yet committed (another server's DELETE)
        remover.execute(
            sql.SQL("DELETE FROM {} WHERE subject = 'support'").format(
                sql.Identifier(settings.schema, "budgets")
            )
        )
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                if write == "reserve":
                    outcome["held"] = ledger.reserve(
                        scope, Decimal("1"), datetime.now(UTC), timedelta(minutes=10), uuid4()
                    )
                else:
                    outcome["held"] = ledger.charge(scope, Decimal("1"), datetime.now(UTC), uuid4())
            except Exception as error:  # what the call met is the assertion
                outcome["error"] = error

        # When a call's reservation (or a stored step's charge) reaches the budget meanwhile
        caller = threading.Thread(target=call)
        caller.start()
        watcher = psycopg.connect(settings.database_url or "", autocommit=True)
        deadline = time.monotonic() + 30
        while not _waiting_on_a_lock(watcher, settings.schema) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _waiting_on_a_lock(watcher, settings.schema), "the call never waited for the removal"
        watcher.close()
        # And the removal commits
        remover.commit()
        caller.join(30)
        # Then the call finds no budget: nothing held or charged, no error
        assert "error" not in outcome, repr(outcome.get("error"))
        assert outcome["held"] in (None, [])
        assert ledger.open_reservations() == 0
    finally:
        remover.close()
        ledger.close()
        engine.close()


@pytest.mark.parametrize("second", ["set", "remove"])
def test_two_processes_setting_one_budget_leave_the_ledger_on_the_terms_last_recorded(
    settings: Settings, second: str
) -> None:
    """Setting a budget appends its event, then writes the ledger row the calls are checked
    against, neither under a lock another process shares: engine A's set to $1 stored its event,
    engine B's set to $2 (or its removal) stored its own and wrote the row, then A's slower
    write put $1 back (or the removed budget in force again). The audit trail said $2 (removed)
    while every call was held to $1. The ledger row now follows the budget's last recorded terms,
    whichever write lands last."""
    with Engine(settings=settings) as a, Engine(settings=settings) as b:
        b.budgets.set("workflow", "wf", "day", "5")
        # Given engine A setting the budget to $1, its event stored, its ledger write slow
        waiting, release = _held_ledger_writes(a, "put")
        slow = threading.Thread(target=a.budgets.set, args=("workflow", "wf", "day", "1"))
        slow.start()
        assert waiting.wait(30)
        # When engine B sets it to $2 (or removes it) meanwhile, and then A's write lands
        if second == "set":
            b.budgets.set("workflow", "wf", "day", "2")
        else:
            b.budgets.remove("workflow", "wf", "day")
        release.set()
        slow.join(30)
        # Then the ledger holds the terms the budget's events last recorded
        aggregate = b.budgets._store.load(budget_uuid(b.budgets.tenant, "workflow", "wf", "day"))
        listed = {burn.spec.subject: burn.spec.limit_usd for burn in b.budgets.burn()}
        if second == "set":
            assert aggregate.limit_usd == Decimal("2")
            assert listed == {"wf": Decimal("2")}
        else:
            assert aggregate.removed
            assert listed == {}


async def test_an_alert_whose_event_could_not_be_appended_is_appended_later_and_sent(
    settings: Settings, receiver: Receiver
) -> None:
    # (The ledger marked the alert raised, the append of AlertRaised failed, and the step's
    # charge tried again found the alert marked: neither the event nor the webhook ever came.)
    notifier = WebhookNotifier(initial_wait_s=0.01, allow_private=True)  # the receiver is on loopback
    engine = Engine(settings=settings, alerts=notifier)
    try:
        engine.start_session("lost-alert", "support")
        budget_id = budget_uuid(engine.tenant, "tenant", engine.tenant, "day")
        engine.budgets.set("tenant", None, "day", "1", mode="alert", webhook_url=receiver.url)
        # Given an event store that cannot take the budget's next append
        real_write = engine.store.write
        refused: list[str] = []

        def write_once_refused(key: str, *args: Any, **kwargs: Any) -> Any:
            if key.startswith("budget:") and not refused:
                refused.append(key)
                raise StoreUnavailable("append", "the server went away")
            return real_write(key, *args, **kwargs)

        engine.store.write = write_once_refused  # type: ignore[method-assign]
        # When a step's cost crosses the 50 % threshold
        usage = LlmUsage(
            provider="x", request_model=MODEL, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.6")
        )
        engine.record_step("lost-alert", "a", usage=usage, idempotency_key="a")
        # Then the step is stored, and the alert is appended once the store takes it, and sent
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and engine.budgets.later.waiting:
            await asyncio.sleep(0.05)
        await notifier.drain()
        alerts = [e.threshold for e in engine.store.events(budget_id) if isinstance(e, Budget.AlertRaised)]
        assert refused
        assert alerts == [50]
        assert len(receiver.requests) == 1
        assert engine.get_session("lost-alert").step_count == 1
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("budget_windows", "spent_usd", "NaN"),
        ("budget_windows", "reserved_usd", "Infinity"),
        ("budgets", "limit_usd", "NaN"),  # the row's CHECK (limit_usd > 0) lets NaN through
    ],
)
@pytest.mark.parametrize("mode", ["enforce", "alert"])
async def test_a_ledger_amount_edited_to_no_number_is_named_not_an_internal_error(
    settings: Settings, simulator: Any, table: str, column: str, value: str, mode: str
) -> None:
    # Given a budget whose ledger row was edited in the database to an amount that is no number
    engine = Engine(settings=settings, llm=client(simulator.base_url))
    try:
        engine.start_session("s", "support")
        engine.budgets.set("workflow", "support", "day", "100", mode=mode)
        await engine.process_step("s", "greet", {"message": "hi"}, idempotency_key="k0")
        calls = simulator.stats["requests"]
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {}.{} SET {} = %s::numeric").format(
                    sql.Identifier(settings.schema), sql.Identifier(table), sql.Identifier(column)
                ),
                [value],
            )
        # When a step it covers is processed
        if mode == "alert":
            # Then an alert budget, which refuses nothing, lets it through
            await engine.process_step("s", "greet", {"message": "hi"}, idempotency_key="k1")
            assert simulator.stats["requests"] == calls + 1
            assert engine.history("s")[-1].event_type.endswith("StepProcessed")
            return
        with pytest.raises(BudgetLedgerDamaged) as refused:
            await engine.process_step("s", "greet", {"message": "hi"}, idempotency_key="k1")
        # Then an enforced one refuses it unsent, as a budget it would exceed, naming the amount:
        # it raised decimal.InvalidOperation, an HTTP 500 "internal error", and the step failed
        # as "InvalidOperation: [<class 'decimal.InvalidOperation'>]"
        assert f"holds {column} = {value}, not an amount" in str(refused.value)
        assert str(refused.value).startswith("budget workflow:support per day cannot be checked")
        assert simulator.stats["requests"] == calls
        failed = engine.history("s")[-1]
        assert failed.event_type.endswith("StepFailed")
        assert (failed.data["error_type"], failed.data["error_message"]) == (
            "budget_exceeded",
            str(refused.value),
        )
    finally:
        await engine.aclose()


async def test_a_refused_call_is_kept_under_its_model_on_the_cost_dashboard(
    settings: Settings, simulator: Any
) -> None:
    # Given a budget that refuses a step's call
    engine = Engine(settings=settings, llm=client(simulator.base_url))
    try:
        engine.start_session("tiny", "support")
        engine.budgets.set("workflow", "support", "day", "0.01")
        with pytest.raises(BudgetExceeded):
            await engine.process_step("tiny", "greet", {"message": "hi"}, idempotency_key="g1")
        # When the cost dashboard is read by model
        projector = projector_for(engine)
        projector.catch_up()
        with projector.connect() as conn:
            since = datetime.now(UTC) - timedelta(hours=1)
            rows = dashboard(conn, projector.names.reader, since=since, by=["model"], tenant="default")
        usage = engine.history("tiny")[-1].data["usage"]
    finally:
        await engine.aclose()
    # Then the refusal is under the model it was refused for, with no request, no cost and no
    # latency, as the open breaker's refusal is: it carried no usage and was counted under
    # "(none)", so no model's refusals could be told apart
    [row] = rows
    assert (row.group, row.calls, row.errors_by_type) == ((MODEL,), 1, {"budget_exceeded": 1})
    assert (row.cost_usd, row.latency_p50_ms) == (Decimal(0), None)
    assert (usage.request_model, usage.attempts, usage.cost_usd) == (MODEL, 0, Decimal(0))
    assert simulator.stats["requests"] == 0
