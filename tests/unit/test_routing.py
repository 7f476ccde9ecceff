"""Model routing: cheapest model whose observed p95 meets the target; pure, no I/O."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowledger.domain.errors import ValidationError
from flowledger.domain.routing import (
    LatencyStats,
    RouteReason,
    RoutingPolicy,
    observed_latencies,
    percentile,
)
from flowledger.domain.values import LlmUsage

COSTS = {
    "deepseek-v3.2": Decimal("0.0001"),
    "gemini-2.5-flash": Decimal("0.0006"),
    "gpt-4.1": Decimal("0.0020"),
    "claude-sonnet-4.5": Decimal("0.0040"),
}


def stats(model: str, p95: float, samples: int = 20) -> LatencyStats:
    return LatencyStats(model=model, samples=samples, p50_ms=p95 / 2, p95_ms=p95)


def usage(model: str, latency_ms: float) -> LlmUsage:
    return LlmUsage(request_model=model, latency_ms=latency_ms)


def test_the_cheapest_model_meeting_the_target_wins() -> None:
    policy = RoutingPolicy(costs=COSTS, latency_target_ms=100)
    observed = {
        "deepseek-v3.2": stats("deepseek-v3.2", 140),
        "gemini-2.5-flash": stats("gemini-2.5-flash", 80),
        "gpt-4.1": stats("gpt-4.1", 60),
        "claude-sonnet-4.5": stats("claude-sonnet-4.5", 150),
    }
    route = policy.choose(observed)
    assert (route.model, route.reason, route.p95_ms) == ("gemini-2.5-flash", RouteReason.MEETS_TARGET, 80)


def test_latency_comes_from_recorded_usage_not_a_table() -> None:
    usages = [usage("deepseek-v3.2", 40 + i) for i in range(19)] + [usage("deepseek-v3.2", 900)]
    usages += [usage("gpt-4.1", 70.0) for _ in range(20)]
    observed = observed_latencies(usages)
    assert observed["deepseek-v3.2"].p95_ms == 58
    assert observed["deepseek-v3.2"].samples == 20
    # One slow call more pushes deepseek's p95 to 900 ms: gpt-4.1 (70 ms) takes over.
    policy = RoutingPolicy(costs=COSTS, latency_target_ms=100)
    assert policy.choose(observed).model == "deepseek-v3.2"
    slower = observed_latencies([*usages, usage("deepseek-v3.2", 950)])
    assert slower["deepseek-v3.2"].p95_ms == 900
    assert policy.choose(slower).model == "gpt-4.1"


def test_only_the_most_recent_window_counts() -> None:
    old_slow = [usage("m", 500.0) for _ in range(50)]
    recent_fast = [usage("m", 20.0) for _ in range(10)]
    assert observed_latencies(old_slow + recent_fast, window=10)["m"].p95_ms == 20


def test_tiers_restrict_the_choice_by_priority() -> None:
    policy = RoutingPolicy(
        costs=COSTS,
        latency_target_ms=200,
        tiers={"high": ("claude-sonnet-4.5", "gpt-4.1"), "low": ("deepseek-v3.2", "gemini-2.5-flash")},
    )
    observed = {m: stats(m, 100) for m in COSTS}
    assert policy.choose(observed, priority="high").model == "gpt-4.1"
    assert policy.choose(observed, priority="low").model == "deepseek-v3.2"
    with pytest.raises(ValidationError, match=r"priority: unknown tier 'urgent'; have \['high', 'low'\]"):
        policy.choose(observed, priority="urgent")


def test_an_unobserved_model_is_tried_before_giving_up_on_the_target() -> None:
    policy = RoutingPolicy(costs=COSTS, latency_target_ms=50)
    observed = {"deepseek-v3.2": stats("deepseek-v3.2", 90), "gpt-4.1": stats("gpt-4.1", 3, samples=2)}
    route = policy.choose(observed)
    assert (route.model, route.reason, route.p95_ms) == ("gemini-2.5-flash", RouteReason.UNOBSERVED, None)


def test_when_nothing_meets_the_target_the_fastest_observed_model_is_chosen() -> None:
    policy = RoutingPolicy(costs=COSTS, latency_target_ms=10)
    observed = {m: stats(m, p) for m, p in zip(COSTS, (90, 80, 70, 75), strict=True)}
    route = policy.choose(observed)
    assert (route.model, route.reason) == ("gpt-4.1", RouteReason.FASTEST)


def test_a_policy_needs_priced_models_and_a_positive_target() -> None:
    with pytest.raises(ValidationError, match=r"costs: need at least one model"):
        RoutingPolicy(costs={}, latency_target_ms=100)
    with pytest.raises(ValidationError, match=r"latency_target_ms: must be > 0"):
        RoutingPolicy(costs=COSTS, latency_target_ms=0)
    with pytest.raises(ValidationError, match=r"tiers\.high: needs priced models; unknown: \['unpriced'\]"):
        RoutingPolicy(costs=COSTS, latency_target_ms=100, tiers={"high": ("unpriced",)})


models = st.sampled_from(sorted(COSTS))
observations = st.dictionaries(
    models,
    st.builds(
        lambda p, n: (p, n),
        st.floats(min_value=1, max_value=1000, allow_nan=False),
        st.integers(min_value=1, max_value=40),
    ),
)


@given(observations, st.floats(min_value=1, max_value=1000, allow_nan=False))
def test_the_choice_is_never_beaten_by_a_cheaper_model_that_meets_the_target(
    raw: dict[str, tuple[float, int]], target: float
) -> None:
    policy = RoutingPolicy(costs=COSTS, latency_target_ms=target)
    observed = {m: stats(m, p, n) for m, (p, n) in raw.items()}
    route = policy.choose(observed)
    trusted = {m: s for m, s in observed.items() if s.samples >= policy.min_samples}
    meeting = {m for m, s in trusted.items() if s.p95_ms <= target}
    assert route.model in COSTS
    if meeting:
        assert route.model in meeting
        assert all(COSTS[route.model] <= COSTS[m] for m in meeting)
    else:
        assert route.reason in (RouteReason.UNOBSERVED, RouteReason.FASTEST)


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1), st.floats(0.01, 1))
def test_a_percentile_is_one_of_the_values_and_grows_with_q(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p in values
    assert percentile(values, 1.0) == max(values)
    assert p <= percentile(values, min(1.0, q + 0.1))
