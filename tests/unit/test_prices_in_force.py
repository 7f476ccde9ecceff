"""What-ifs price at the entries in force, never at one that takes effect later: ``--reprice-as``
and the tier what-ifs read ``PriceTable.latest()`` / ``price_for(at=None)``, the newest entry of
a scheduled model, so a price announced for next month already repriced this month's calls."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from flowledger.domain.price_table import DatedPrice, PriceTable
from flowledger.domain.pricing import ModelPrice

NOW = datetime(2026, 12, 5, tzinfo=UTC)


def price(per_token: str) -> ModelPrice:
    return ModelPrice(input_cost_per_token=Decimal(per_token), output_cost_per_token=Decimal(per_token))


def test_in_force_takes_each_models_entry_at_the_moment_and_leaves_out_models_not_priced_yet() -> None:
    table = PriceTable(
        version="t",
        prices={"plain": price("0.001")},
        schedule={
            "cut": [
                DatedPrice(effective_from=datetime(2026, 1, 1, tzinfo=UTC), price=price("0.002")),
                DatedPrice(effective_from=datetime(2027, 1, 1, tzinfo=UTC), price=price("0.0001")),
            ],
            "coming": [DatedPrice(effective_from=datetime(2027, 1, 1, tzinfo=UTC), price=price("0.003"))],
        },
    )

    in_force = table.in_force(NOW)

    assert in_force == {"plain": price("0.001"), "cut": price("0.002")}
    assert table.latest()["cut"] == price("0.0001")  # what the what-ifs used to price with


def test_a_what_ifs_model_is_found_by_any_name_a_call_is_priced_by_and_only_while_in_force() -> None:
    table = PriceTable(
        version="t",
        prices={"gpt-4.1": price("0.001")},
        schedule={
            "coming": [DatedPrice(effective_from=datetime(2027, 1, 1, tzinfo=UTC), price=price("0.003"))]
        },
        aliases={"azure/prod": "gpt-4.1"},
    )

    assert table.key_in_force("openai/gpt-4.1", NOW) == "gpt-4.1"
    assert table.key_in_force("gpt-4.1-2025-04-14", NOW) == "gpt-4.1"
    assert table.key_in_force("azure/prod", NOW) == "gpt-4.1"
    assert table.key_in_force("coming", NOW) is None  # priced from next year only
    assert table.key_in_force("nosuch", NOW) is None


async def test_a_call_sent_after_a_price_change_is_priced_as_a_repricing_with_the_same_file_prices_it() -> (
    None
):
    """A call began at 23:59:59.5, before its model's price halved at midnight, and its request
    went out (queued behind the limits, say) and was answered at 00:00:00.5: it was recorded at
    the old price ($0.0028), while its step is recorded after midnight, so ``prices reprice``
    with the very table it was priced by made it $0.0014. A call is priced at the entry in
    force as its answer comes, which is what a repricing prices it by."""
    import json

    import httpx

    from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient
    from flowledger.infrastructure import Engine
    from flowledger.projections.repricing import Repricing, call_cost
    from tests.support.clock import SetClock

    midnight = datetime(2026, 12, 1, tzinfo=UTC)
    table = PriceTable(
        version="halved",
        prices={},
        schedule={
            "m": [
                DatedPrice(
                    effective_from=datetime(2025, 1, 1, tzinfo=UTC), price=per("0.000002", "0.000008")
                ),
                DatedPrice(effective_from=midnight, price=per("0.000001", "0.000004")),
            ]
        },
    )
    clock = SetClock(datetime(2026, 11, 30, 23, 59, 59, 500000, tzinfo=UTC))

    def answer(request: httpx.Request) -> httpx.Response:
        clock.now = datetime(2026, 12, 1, 0, 0, 0, 500000, tzinfo=UTC)  # sent and answered after midnight
        reply = {"message": "hi"}
        return httpx.Response(
            200,
            json={
                "id": "c-1",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": json.dumps(reply)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
            },
        )

    config = ClientConfig(base_url="http://llm.test/v1", api_key=ApiKey("sk-test-key"), default_model="m")
    llm = OpenAICompatibleClient(config, prices=table, transport=httpx.MockTransport(answer))
    engine = Engine.in_memory(clock=clock, llm=llm)
    try:
        # Given a call that began before the change and was answered after it
        engine.start_session("s-1", "wf")
        record = await engine.process_step("s-1", "greet", {"message": "x"}, idempotency_key="k-1")
        assert record.usage is not None
        (event,) = [e for e in engine.history("s-1") if e.event_type.endswith("StepProcessed")]
        # When a repricing from before the change prices it with the same table
        again = call_cost(
            record.usage, event.timestamp, [Repricing(datetime(2026, 11, 1, tzinfo=UTC), table, "x")]
        )
        # Then both are the new price: 1000 x $1/M + 100 x $4/M
        assert record.usage.cost_usd == Decimal("0.0014")
        assert again.cost_usd == record.usage.cost_usd
    finally:
        await engine.aclose()


def per(input_price: str, output_price: str) -> ModelPrice:
    return ModelPrice(input_cost_per_token=Decimal(input_price), output_cost_per_token=Decimal(output_price))
