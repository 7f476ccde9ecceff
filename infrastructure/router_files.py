"""Loading the task router's data files: the skill catalogue and the model tiers.

Each ships in the package (``skills.json``, ``routing.json``) and may be replaced by a
file named in the settings (``FLOWLEDGER_SKILL_CATALOGUE_FILE``, ``FLOWLEDGER_ROUTING_FILE``),
as the price table is. A file that cannot be read or is malformed is a ValidationError.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from flowledger.domain.errors import ValidationError
from flowledger.domain.model_tiers import ModelTiers
from flowledger.domain.skills import SkillCatalogue


def load_skill_catalogue(path: Path | None = None) -> SkillCatalogue:
    """The catalogue in ``path``, or the shipped one."""
    data, label = _read("skill_catalogue_file", "skills.json", path)
    return SkillCatalogue.from_data(data, label)


def load_model_tiers(path: Path | None = None) -> ModelTiers:
    """The model tiers in ``path``, or the shipped ones."""
    data, label = _read("routing_file", "routing.json", path)
    return ModelTiers.from_data(data, label)


def _read(setting: str, shipped: str, path: Path | None) -> tuple[dict[str, Any], str]:
    if path is None:
        raw = resources.files("flowledger.infrastructure").joinpath(shipped).read_bytes()
        label = shipped
    else:
        try:
            raw = Path(path).read_bytes()
        except OSError as error:
            raise ValidationError(setting, f"cannot read {path}: {error}") from None
        label = Path(path).name
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise ValidationError(setting, f"{label} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValidationError(setting, f"{label} must hold a JSON object")
    return data, label
