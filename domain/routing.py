"""Model routing: the cheapest model whose observed latency meets a target.

A pure policy. Latencies come from recorded usage (the ``latency_ms`` of past
StepProcessed events), never from a constant table; costs come from the caller
(``PriceTable.estimate``, the domain's pricing rule). Optional tiers restrict which
models a priority may use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from flowledger.domain.errors import ValidationError
from flowledger.domain.values import LlmUsage


@dataclass(frozen=True, kw_only=True)
class LatencyStats:
    """What recent calls to one model took."""

    model: str
    samples: int
    p50_ms: float
    p95_ms: float


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0 < q <= 1) of a non-empty sequence."""
    if not values:
        raise ValidationError("values", "need at least one value")
    if not 0 < q <= 1:
        raise ValidationError("q", f"must be in (0, 1], got {q}")
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def observed_latencies(usages: Iterable[LlmUsage], *, window: int = 200) -> dict[str, LatencyStats]:
    """Latency statistics per model over the last ``window`` usages of each (oldest first in)."""
    if window < 1:
        raise ValidationError("window", "must be >= 1")
    by_model: dict[str, list[float]] = {}
    for usage in usages:
        model = usage.request_model or usage.response_model
        if model:
            by_model.setdefault(model, []).append(usage.latency_ms)
    return {
        model: LatencyStats(
            model=model,
            samples=len(recent),
            p50_ms=percentile(recent, 0.5),
            p95_ms=percentile(recent, 0.95),
        )
        for model, values in by_model.items()
        for recent in [values[-window:]]
    }


class RouteReason(StrEnum):
    """Why a model was chosen."""

    MEETS_TARGET = "cheapest model whose observed p95 meets the target"
    UNOBSERVED = "no observed model meets the target; trying the cheapest unobserved one"
    FASTEST = "no model meets the target; choosing the fastest observed"


@dataclass(frozen=True, kw_only=True)
class Route:
    """The chosen model, why, and the figures behind the choice."""

    model: str
    reason: RouteReason
    cost_per_call: Decimal
    p95_ms: float | None


@dataclass(frozen=True, kw_only=True)
class RoutingPolicy:
    """Cheapest model meeting a p95 latency target, optionally restricted by priority tier.

    ``costs`` is the expected cost of one call per model; ``tiers`` maps a priority
    (e.g. ``"high"``) to the models it may use. A model needs ``min_samples``
    observations before its latency is trusted.
    """

    costs: Mapping[str, Decimal]
    latency_target_ms: float
    tiers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    min_samples: int = 5

    def __post_init__(self) -> None:
        if not self.costs:
            raise ValidationError("costs", "need at least one model")
        if any(not isinstance(c, Decimal) or c < 0 for c in self.costs.values()):
            raise ValidationError("costs", "must be Decimals >= 0")
        if not self.latency_target_ms > 0:
            raise ValidationError("latency_target_ms", "must be > 0")
        if self.min_samples < 1:
            raise ValidationError("min_samples", "must be >= 1")
        for tier, models in self.tiers.items():
            unknown = [m for m in models if m not in self.costs]
            if not models or unknown:
                raise ValidationError(f"tiers.{tier}", f"needs priced models; unknown: {unknown}")

    def candidates(self, priority: str | None = None) -> tuple[str, ...]:
        """The models a priority may use (every priced model when no tier applies)."""
        if priority is None or not self.tiers:
            return tuple(sorted(self.costs))
        if priority not in self.tiers:
            raise ValidationError("priority", f"unknown tier {priority!r}; have {sorted(self.tiers)}")
        return tuple(sorted(set(self.tiers[priority])))

    def choose(self, observed: Mapping[str, LatencyStats], priority: str | None = None) -> Route:
        """Pick a model for one call, given latencies observed so far."""
        models = self.candidates(priority)
        trusted = {
            m: observed[m] for m in models if m in observed and observed[m].samples >= self.min_samples
        }
        meeting = [m for m, s in trusted.items() if s.p95_ms <= self.latency_target_ms]
        if meeting:
            best = min(meeting, key=lambda m: (self.costs[m], trusted[m].p95_ms, m))
            return self._route(best, RouteReason.MEETS_TARGET, trusted)
        unobserved = [m for m in models if m not in trusted]
        if unobserved:
            best = min(unobserved, key=lambda m: (self.costs[m], m))
            return self._route(best, RouteReason.UNOBSERVED, trusted)
        best = min(trusted, key=lambda m: (trusted[m].p95_ms, self.costs[m], m))
        return self._route(best, RouteReason.FASTEST, trusted)

    def _route(self, model: str, reason: RouteReason, trusted: Mapping[str, LatencyStats]) -> Route:
        stats = trusted.get(model)
        return Route(
            model=model,
            reason=reason,
            cost_per_call=self.costs[model],
            p95_ms=stats.p95_ms if stats is not None else None,
        )
