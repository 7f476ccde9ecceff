"""Loading the task router's data files: the skill catalogue and the model tiers.

Each ships in the package (``skills.json``, ``routing.json``) and may be replaced by a
file named in the settings (``FLOWLEDGER_SKILL_CATALOGUE_FILE``, ``FLOWLEDGER_ROUTING_FILE``),
as the price table is. A file that cannot be read or is malformed is a ValidationError, and
so is a routing file naming a model the price table in use cannot price.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from flowledger.domain.bounds import json_problem
from flowledger.domain.errors import UnknownModelPrice, ValidationError
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.skills import SkillCatalogue


def require_readable(field: str, variable: str, path: Path | None) -> None:
    """Refuse a file the operator named (``variable``) that cannot be opened for reading: a
    missing price file let an engine without a model endpoint start, and was found only by
    the first use of its prices (a repricing, the tier panel)."""
    if path is None:
        return
    try:
        with Path(path).open("rb"):
            pass
    except OSError as error:
        why = error.strerror or type(error).__name__
        raise ValidationError(field, f"{variable} names {path}, which cannot be read: {why}") from None


def load_skill_catalogue(path: Path | None = None) -> SkillCatalogue:
    """The catalogue in ``path`` (read again each time: the operator may change it), or the
    shipped one."""
    if path is None:
        return _shipped_skill_catalogue()
    data, label = _read("skill_catalogue_file", "skills.json", path)
    return SkillCatalogue.from_data(data, label)


@cache
def _shipped_skill_catalogue() -> SkillCatalogue:
    """The package's catalogue, read and checked once a process: it cannot change while the
    process runs, and checking every skill of it took 6-12 ms of CPU at each engine's start."""
    data, label = _read("skill_catalogue_file", "skills.json", None)
    return SkillCatalogue.from_data(data, label)


def load_model_tiers(
    path: Path | None = None, *, check_model: Callable[[str], object] | None = None
) -> ModelTiers:
    """The model tiers in ``path``, or the shipped ones; with ``check_model`` (the LLM
    adapter's, ``ModelCheck``), every model they name checked against its price table."""
    data, label = _read("routing_file", "routing.json", path)
    tiers = ModelTiers.from_data(data, label)
    if check_model is not None:
        require_priced(tiers, check_model, label)
    return tiers


def routing_label(path: Path | None) -> str:
    """How errors name the routing file: its name, or the shipped one's."""
    return "routing.json" if path is None else Path(path).name


def require_priced(tiers: ModelTiers, check_model: Callable[[str], object], label: str) -> None:
    """Refuse tiers naming a model that ``check_model`` cannot price (UnknownModelPrice).

    Found here, when the engine is built, rather than by the first classification routed to
    that model (recorded as ``ClassificationFailed``) and by the tier dashboard (a 422 that
    blamed the caller). An adapter that flags unpriced calls instead of refusing them
    (``unpriced_models="flag"``) accepts every model, and so does this.
    """
    unpriced: list[str] = []
    version = ""
    for model in tiers.models():
        try:
            check_model(model)
        except UnknownModelPrice as error:
            unpriced.append(model)
            version = error.price_version
    if unpriced:
        raise ValidationError(
            "routing_file",
            f"{label} names models with no price in price table {version!r}: {unpriced}"
            " (price them in FLOWLEDGER_PRICING_FILE, or route to priced ones)",
        )


def _read(setting: str, shipped: str, path: Path | None) -> tuple[dict[str, Any], str]:
    if path is None:
        raw = resources.files("flowledger.infrastructure").joinpath(shipped).read_bytes()
        label = shipped
    else:
        try:
            raw = Path(path).read_bytes()
        except OSError as error:
            variable = f"FLOWLEDGER_{setting.upper()}"
            why = error.strerror or str(error)  # str(error) names the path again
            raise ValidationError(setting, f"cannot read {path} (named by {variable}): {why}") from None
        label = Path(path).name
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ValidationError(setting, f"{label} is not JSON: {json_problem(error)}") from None
    if not isinstance(data, dict):
        raise ValidationError(setting, f"{label} must hold a JSON object")
    return data, label
