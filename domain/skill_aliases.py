"""Other spellings of a skill (``golang``: ``go``), the skill catalogue's ``aliases``: data,
versioned with the catalogue, so that a task naming one spelling goes to an agent registered
with another. A task naming "golang" was escalated ``no_capable_agent`` beside an idle agent
registered with "go". Skills are compared through ``Needs.spelt`` (``domain.assignment``);
what agents and tasks were given is stored and shown as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flowledger.domain.agent import normalise_skills
from flowledger.domain.errors import ValidationError


@dataclass(frozen=True)
class SkillAliases:
    """Each spelling named in the table, with every spelling of its skill (itself included)."""

    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, table: Mapping[str, Any], label: str = "skill catalogue") -> SkillAliases:
        """From a table of skill -> its other spellings (``{"golang": ["go"]}``), each in a
        skill's one spelling (``normalise_skills``). ValidationError, naming the entry, when a
        spelling is named twice (as an alias of two skills, or as a skill and another's alias:
        which skill it meant would be a guess), or an entry names no other spelling."""
        if not isinstance(table, Mapping):
            raise ValidationError("skill_catalogue.aliases", f"{label}: must be an object of skill lists")
        groups: dict[str, frozenset[str]] = {}
        for raw, others in table.items():
            where = f"skill_catalogue.aliases.{raw}"
            if not isinstance(others, list) or not all(isinstance(s, str) for s in others):
                raise ValidationError(where, f"{label}: must be a list of skill names")
            if not others:
                raise ValidationError(where, f"{label}: must name at least one other spelling")
            spellings = normalise_skills(where, [str(raw), *others])
            if len(spellings) < 2:
                raise ValidationError(where, f"{label}: must name at least one other spelling")
            for spelling in spellings:
                if spelling in groups:
                    raise ValidationError(
                        where, f"{label}: {spelling!r} is named twice (one spelling, one skill)"
                    )
            group = frozenset(spellings)
            groups.update(dict.fromkeys(spellings, group))
        return cls(groups)

    def equivalents(self, skill: str) -> frozenset[str]:
        """Every spelling of ``skill``, itself included."""
        return self.groups.get(skill, frozenset({skill}))
