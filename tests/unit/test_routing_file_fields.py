"""A routing file is read as written or refused, naming the field: a misspelt field was read
as its default (no fallback, ranking off), and a tier named twice in two cases kept the last."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.router_files import load_model_tiers

SHIPPED = Path(__file__).parents[2] / "infrastructure" / "routing.json"


def _routing(drop: str = "", **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SHIPPED.read_text())
    data.pop(drop, None)
    return {**data, **changes}


def _tiers(**changes: Any) -> dict[str, Any]:
    return {**_routing()["tiers"], **changes}


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        (_routing("fallback", fallbacks=["deepseek-v3.2"]), "routing", r"unknown fields \['fallbacks'\]"),
        (
            _routing("model_ranked_matching", model_ranked_matchng=True),
            "routing",
            r"unknown fields \['model_ranked_matchng'\]",
        ),
        (_routing(tiers=_tiers(HIGH=["gemini-2.5-flash"])), "routing.tiers.HIGH", "names tier 'high' twice"),
        (_routing(tiers=_tiers(urgent=["gemini-2.5-flash"])), "routing.tiers.urgent", "not a priority"),
        (_routing(version="v\x001"), "routing.version", "NUL"),
        # A tier's model is asked for as written: "gemini\x01-2.5" was sent on every low
        # classification (refused, then retried on the fallback); " gemini-2.5-flash" was
        # called and recorded with its space
        (
            _routing(tiers=_tiers(low=["gemini\x01-2.5"])),
            "routing.tiers.low",
            r"model 'gemini\\x01-2.5' must not contain control characters \(found U\+0001\)",
        ),
        (
            _routing(tiers=_tiers(low=[" gemini-2.5-flash"])),
            "routing.tiers.low",
            "model ' gemini-2.5-flash' must have no space around it",
        ),
        (_routing(tiers=_tiers(high=["m" * 201])), "routing.tiers.high", "must be at most 200 characters"),
        (_routing(fallback=["deepseek-v3.2\n"]), "routing.fallback", "must not contain control characters"),
    ],
)
def test_a_routing_file_read_otherwise_than_written_is_refused_naming_the_field(
    tmp_path: Path, data: dict[str, Any], field: str, says: str
) -> None:
    # Given a routing file with one fault
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(data))
    # When it is loaded, Then it is refused, naming the field
    with pytest.raises(ValidationError, match=says) as refused:
        load_model_tiers(path)
    assert refused.value.field == field


def test_the_shipped_routing_file_and_a_tier_in_upper_case_still_load(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    tiers = _routing()["tiers"]
    path.write_text(json.dumps(_routing(tiers={"CRITICAL": tiers.pop("critical"), **tiers})))
    assert load_model_tiers(path).tiers["critical"] == ("claude-sonnet-4.5",)
    assert load_model_tiers().fallback == ("deepseek-v3.2", "gemini-2.5-flash")
