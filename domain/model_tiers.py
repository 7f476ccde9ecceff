"""Model tiers by priority (the seed's mixed strategy), as a versioned routing configuration.

Each priority lists the models it may use; the latency-target policy (``routing.py``)
picks among them. ``fallback`` names the models a failed classification is retried on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from flowledger.domain.bounds import require_model, require_name
from flowledger.domain.errors import ValidationError
from flowledger.domain.routing import RoutingPolicy
from flowledger.domain.task_views import TaskPriority

_FIELDS = ("version", "description", "tiers", "fallback", "latency_target_ms", "model_ranked_matching")
"""A routing file's fields: any other is refused, as a misspelt ``fallbacks`` was read as no
fallback and a misspelt ``model_ranked_matching`` as off, without a word said."""


UNPRICED = Decimal("Infinity")
"""The cost a routing policy gives a model without a price: more than any priced one."""


@dataclass(frozen=True, kw_only=True)
class ModelTiers:
    """Which models each priority may use, the fallbacks, and the latency target."""

    version: str
    tiers: Mapping[str, tuple[str, ...]]
    fallback: tuple[str, ...] = ()
    latency_target_ms: float = 2000.0
    model_ranked_matching: bool = False
    extra_models: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.version.strip():
            raise ValidationError("routing.version", "must be a non-empty string")
        names = {p.value for p in TaskPriority}
        if set(self.tiers) != names:
            raise ValidationError(
                "routing.tiers", f"must name exactly {sorted(names)}, got {sorted(self.tiers)}"
            )
        for tier, models in self.tiers.items():
            if not models or not all(isinstance(m, str) and m.strip() for m in models):
                raise ValidationError(f"routing.tiers.{tier}", "must list at least one model name")
        # Each is asked for as written, as a step's model is (``require_model``): a tier's
        # "gemini\x01-2.5" was sent to the provider on every classification (refused, then
        # retried on the fallback), and " gemini-2.5-flash" was called and recorded with its space.
        named = [(f"routing.tiers.{tier}", m) for tier, models in self.tiers.items() for m in models]
        for field_name, model in [*named, *(("routing.fallback", m) for m in self.fallback)]:
            try:
                require_model(model)
            except ValidationError as error:
                raise ValidationError(field_name, f"model {model[:60]!r} {error.message}") from None
        if not self.latency_target_ms > 0:
            raise ValidationError("routing.latency_target_ms", "must be > 0")

    @classmethod
    def from_data(cls, data: Mapping[str, Any], label: str = "routing") -> ModelTiers:
        """The configuration from its JSON form (see ``infrastructure/routing.json``)."""
        unknown = sorted(str(key) for key in data if key not in _FIELDS)
        if unknown:
            raise ValidationError("routing", f"{label}: unknown fields {unknown} (known: {list(_FIELDS)})")
        version, tiers = data.get("version"), data.get("tiers")
        if not isinstance(version, str) or not isinstance(tiers, Mapping):
            raise ValidationError("routing", f"{label} needs a string 'version' and a 'tiers' object")
        require_name("routing.version", version)  # it is quoted in every classification's route
        fallback = data.get("fallback", [])
        if not isinstance(fallback, list) or not all(isinstance(m, str) and m for m in fallback):
            raise ValidationError("routing.fallback", f"{label}: must be a list of model names")
        target = data.get("latency_target_ms", 2000.0)
        ranked = data.get("model_ranked_matching", False)
        if isinstance(target, bool) or not isinstance(target, int | float):
            raise ValidationError("routing.latency_target_ms", f"{label}: must be a number")
        if not isinstance(ranked, bool):
            raise ValidationError("routing.model_ranked_matching", f"{label}: must be true or false")
        return cls(
            version=version,
            tiers=_tiers(tiers, label),
            fallback=tuple(fallback),
            latency_target_ms=float(target),
            model_ranked_matching=ranked,
        )

    @classmethod
    def single(cls, model: str) -> ModelTiers:
        """Every priority on one model (the policy tier repricing compares against)."""
        return cls(version=f"all-{model}", tiers={p.value: (model,) for p in TaskPriority})

    def models(self) -> tuple[str, ...]:
        """Every model the configuration names."""
        return tuple(sorted({m for ms in self.tiers.values() for m in ms} | set(self.fallback)))

    def policy(self, costs: Mapping[str, Decimal]) -> RoutingPolicy:
        """The latency-target policy restricted to these tiers (``costs`` per call, by model).

        A model ``costs`` does not price (a tier may name one where unpriced models are
        flagged) comes after every priced one: counted as free, it had always been chosen."""
        return RoutingPolicy(
            costs={m: costs.get(m, UNPRICED) for m in self.models()},
            latency_target_ms=self.latency_target_ms,
            tiers=dict(self.tiers),
        )

    def fallback_for(self, failed: str) -> str | None:
        """The model to retry a failed call on: the first fallback other than ``failed``."""
        return next((m for m in self.fallback if m != failed), None)


def _tiers(value: Mapping[str, Any], label: str) -> dict[str, tuple[str, ...]]:
    """Models by priority, each priority named once in any case (``HIGH`` beside ``high``: the
    last one silently won)."""
    tiers: dict[str, tuple[str, ...]] = {}
    for name, models in value.items():
        try:
            priority = TaskPriority.parse(name if isinstance(name, str) else "").value
        except ValidationError:
            names = [p.value for p in TaskPriority]
            raise ValidationError(
                f"routing.tiers.{name}", f"{label}: not a priority, one of {names}"
            ) from None
        if priority in tiers:
            raise ValidationError(f"routing.tiers.{name}", f"{label}: names tier {priority!r} twice")
        tiers[priority] = _models(models, name, label)
    return tiers


def _models(value: Any, tier: Any, label: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise ValidationError(f"routing.tiers.{tier}", f"{label}: must be a list of model names")
    return tuple(value)
