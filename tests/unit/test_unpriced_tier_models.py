"""A routing tier that names a model without a price (allowed with unpriced models flagged)
picks its priced models first: the model without a price had counted as free, so the policy,
which takes the cheapest model meeting the latency target, always chose it."""

from __future__ import annotations

import json
from pathlib import Path

from flowledger.adapters.llm import load_price_table
from flowledger.domain.task_views import TaskPriority
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm


class PricedLlm(ScriptedLlm):
    """A scripted model whose adapter prices by the shipped table (as the real client does)."""

    prices = load_price_table()


def routing(tmp_path: Path, low: list[str]) -> Path:
    path = tmp_path / "routing.json"
    tiers = {"critical": ["claude-sonnet-4.5"], "high": ["claude-sonnet-4.5"], "medium": ["deepseek-v3.2"]}
    path.write_text(json.dumps({"version": "t-1", "tiers": {**tiers, "low": low}, "fallback": []}))
    return path


def test_a_tier_takes_its_priced_model_before_one_without_a_price(tmp_path: Path) -> None:
    settings = make_settings(
        database_url="memory:", routing_file=routing(tmp_path, ["aaa-local", "gemini-2.5-flash"])
    )
    with Engine(settings=settings, llm=PricedLlm()) as engine:
        model, _why = engine.classifier.route(TaskPriority.LOW)
    assert model == "gemini-2.5-flash"


def test_a_tier_of_models_without_a_price_still_routes(tmp_path: Path) -> None:
    settings = make_settings(
        database_url="memory:", routing_file=routing(tmp_path, ["zzz-local", "aaa-local"])
    )
    with Engine(settings=settings, llm=PricedLlm()) as engine:
        model, _why = engine.classifier.route(TaskPriority.LOW)
    assert model == "aaa-local"
