"""The skill catalogue: what a classified task needs when its creator named no skills.

A pure policy over a versioned table (loaded from a data file at the edge, like prices):
each category maps to skills, words of the description add skills, a complexity may
raise the priority, and the estimated hours set a deadline when none was given. Every
derivation comes back with its reason, so that the event recording it explains itself.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flowledger.domain.agent import normalise_skills
from flowledger.domain.bounds import MAX_DEADLINE, MIN_DERIVED_DEADLINE, require_name, without_ignorables
from flowledger.domain.description_words import WORD, base_words, extensions_of, versioned, words_of
from flowledger.domain.errors import ValidationError
from flowledger.domain.skill_aliases import SkillAliases
from flowledger.domain.task_views import CATEGORIES, COMPLEXITIES, Classification, TaskPriority

_FIELDS = (
    "version",
    "description",
    "categories",
    "keywords",
    "aliases",
    "priority_floors",
    "deadline_factor",
)
"""A catalogue file's fields: any other is refused, as a misspelt ``keyword`` was read as
no keywords at all, every task then routed by its category alone without a word said."""


@dataclass(frozen=True, kw_only=True)
class Derivation:
    """What a classification changes about how a task is routed, and why.

    ``None`` means unchanged: the creator's skills, priority or deadline stand.
    """

    required_skills: tuple[str, ...] | None = None
    priority: TaskPriority | None = None
    deadline: datetime | None = None
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        """The reasons as one sentence ('' when nothing was derived)."""
        return "; ".join(self.reasons)


@dataclass(frozen=True, kw_only=True)
class SkillCatalogue:
    """Skills by category and by description word, priority floors by complexity, deadline slack.

    ``deadline_factor`` times the estimated hours, from the task's creation, is the deadline a
    task gets when its creator gave none (0 turns that off).
    """

    version: str
    categories: Mapping[str, tuple[str, ...]]
    keywords: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    priority_floors: Mapping[str, TaskPriority] = field(default_factory=dict)
    deadline_factor: float = 2.0
    skill_aliases: SkillAliases = field(default_factory=SkillAliases)
    """Other spellings of a skill (``aliases`` in the file: ``{"golang": ["go"]}``), one skill
    wherever skills are compared."""

    def __post_init__(self) -> None:
        if not self.version.strip():
            raise ValidationError("skill_catalogue.version", "must be a non-empty string")
        unknown = sorted(set(self.categories) - set(CATEGORIES))
        missing = sorted(set(CATEGORIES) - set(self.categories))
        if unknown or missing:
            raise ValidationError(
                "skill_catalogue.categories",
                f"must name exactly {list(CATEGORIES)}; unknown {unknown}, missing {missing}",
            )
        odd = sorted(set(self.priority_floors) - set(COMPLEXITIES))
        if odd:
            raise ValidationError("skill_catalogue.priority_floors", f"unknown complexities {odd}")
        factor = self.deadline_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 <= factor <= 100:
            raise ValidationError(
                "skill_catalogue.deadline_factor", f"must be a number in [0, 100], got {factor!r}"
            )

    @classmethod
    def from_data(cls, data: Mapping[str, Any], label: str = "skill catalogue") -> SkillCatalogue:
        """A catalogue from its JSON form (``infrastructure/skills.json``); ValidationError if malformed."""
        unknown = sorted(str(key) for key in data if key not in _FIELDS)
        if unknown:
            raise ValidationError(
                "skill_catalogue", f"{label}: unknown fields {unknown} (known: {list(_FIELDS)})"
            )
        version = data.get("version")
        if not isinstance(version, str):
            raise ValidationError("skill_catalogue", f"{label} needs a string 'version'")
        require_name("skill_catalogue.version", version)  # it is quoted in every derivation's reason
        factor = data.get("deadline_factor", 2.0)
        return cls(
            version=version,
            categories=_skill_map(data.get("categories"), "categories", label),
            keywords=_skill_map(data.get("keywords", {}), "keywords", label),
            priority_floors=_floors(data.get("priority_floors", {}), label),
            deadline_factor=factor,
            skill_aliases=SkillAliases.of(data.get("aliases", {}), label),
        )

    def skills_for(self, category: str, description: str) -> tuple[tuple[str, ...], str]:
        """The skills a task of ``category`` described so needs, and where they came from.

        Words of the description that the catalogue knows name the stack (``Go`` is
        golang); only when none does, the category's own skills apply.
        """
        # Read in Unicode NFKC without the characters drawn as nothing, as skills are
        # (``fold_text``): full-width letters are their ASCII ones, a ligature (U+FB01) is "fi",
        # "Kuber" + a zero-width space + "netes" is one word, so a description matches the
        # keyword it spells.
        written = words_of(unicodedata.normalize("NFKC", without_ignorables(description)))
        folded = {word.casefold() for word in written}
        # A keyword holding a capital matches only as written: "Go" is the language, while
        # "go" in "let's go over the Terraform state" (or "Go live", a sentence's first word
        # before a verb's follower: ``words_of``) names no stack. Others match in any case.
        # A file's extension is no verb, written in lower case by custom: "main.go" is Go
        # (it was routed by its category alone, "Fix the crash in main.go" to python).
        # A lower-case keyword is found in the plural too ("containers", "APIs"), and made a
        # verb ("dockerize", "containerized": ``ENDINGS``); the reason quotes the word found,
        # case folded as the keywords are ('apis', not 'api').
        # A keyword with its version joined ("Vue3", "html5", "go1.22": the toolchain's own
        # spelling, never the verb) matches in any case, the reason quoting the word found.
        extensions, bases, versions = extensions_of(written), base_words(folded), versioned(folded)
        found: dict[str, str] = {}
        for word in self.keywords:
            if word in (folded if word.islower() else written) or word.casefold() in extensions:
                found[word] = word
            elif word.islower() and word in bases:
                found[word] = bases[word]
            elif word.casefold() in versions:
                found[word] = versions[word.casefold()]
        matched = sorted(found)
        if matched:
            skills = tuple(sorted({skill for word in matched for skill in self.keywords[word]}))
            quoted = sorted({found[word] for word in matched})
            source = f"the words {', '.join(repr(w) for w in quoted)} of a {category} task"
        else:
            skills = self.categories.get(category, ())
            source = f"category {category} (no known word in the description)"
        return skills, f"skills {', '.join(skills) or 'none'} from {source}, catalogue {self.version}"

    def derive(
        self,
        classification: Classification,
        *,
        description: str,
        creator_skills: tuple[str, ...],
        creator_priority: TaskPriority,
        creator_deadline: datetime | None,
        now: datetime,
        created_at: datetime | None = None,
        derived_before: datetime | None = None,
    ) -> Derivation:
        """What the classification changes: skills when the creator gave none, a priority
        raised to the complexity's floor, a deadline from the estimate when none was given.

        The deadline counts from ``created_at`` (the task's creation; None: ``now``), since the
        estimate is of the work asked for then: counted from each classification, every
        reclassification with the same estimate pushed it further out. It lies at least
        ``MIN_DERIVED_DEADLINE`` after ``now`` (a task classified late is not escalated at once
        by its own estimate), except that this floor never moves ``derived_before`` (the
        deadline an earlier classification derived) later: only a larger estimate does."""
        reasons: list[str] = []
        skills: tuple[str, ...] | None = None
        if not creator_skills:
            skills, why = self.skills_for(classification.category, description)
            reasons.append(why)
        priority: TaskPriority | None = None
        floor = self.priority_floors.get(classification.complexity)
        if floor is not None and floor.rank > creator_priority.rank:
            priority = floor
            reasons.append(
                f"priority raised from {creator_priority.value} to {floor.value} "
                f"by {classification.complexity} complexity"
            )
        deadline: datetime | None = None
        if creator_deadline is None and self.deadline_factor > 0:
            span = timedelta(hours=classification.estimated_hours * self.deadline_factor)
            # The bound a deadline given by a caller has (require_deadline): up to 100 x 10,000
            # estimated hours would put it a century ahead.
            capped = span > MAX_DEADLINE
            start = now if created_at is None else created_at
            counted = start + min(span, MAX_DEADLINE)
            # And a floor: 2 x 1e-9 hours is the moment of classification itself (a duration
            # rounds to the microsecond), and the next assignment escalated the task at once.
            soonest = now + MIN_DERIVED_DEADLINE
            kept = derived_before is not None and derived_before < soonest
            if kept and derived_before is not None:
                soonest = derived_before
            raised = counted < soonest
            deadline = max(counted, soonest)
            reasons.append(
                f"deadline {deadline.isoformat()} = "
                + ("classified at" if created_at is None else f"created at {created_at.isoformat()}")
                + f" + {self.deadline_factor:g} x {classification.estimated_hours:g} estimated hours"
                + (f", capped at {MAX_DEADLINE.days:,} days ahead (MAX_DEADLINE)" if capped else "")
                + (_floor_words(soonest if kept else None) if raised else "")
            )
        return Derivation(
            required_skills=skills, priority=priority, deadline=deadline, reasons=tuple(reasons)
        )


def _floor_words(derived_before: datetime | None) -> str:
    """Why a derived deadline lies later than its estimate gives (None: the floor ahead)."""
    if derived_before is None:
        return f", raised to {MIN_DERIVED_DEADLINE} ahead (MIN_DERIVED_DEADLINE)"
    return (
        f", kept at the deadline derived before ({derived_before.isoformat()}): a reclassification"
        " moves a derived deadline later only by a larger estimate"
    )


def _floors(value: Any, label: str) -> dict[str, TaskPriority]:
    if not isinstance(value, Mapping):
        raise ValidationError("skill_catalogue.priority_floors", f"{label}: must be an object")
    floors = {}
    for complexity, priority in value.items():
        try:
            floors[str(complexity)] = TaskPriority.parse(priority if isinstance(priority, str) else "")
        except ValidationError:
            names = [p.value for p in TaskPriority]
            raise ValidationError(
                f"skill_catalogue.priority_floors.{complexity}",
                f"{label}: must be one of {names}, got {priority!r}",
            ) from None
    return floors


def _skill_map(value: Any, name: str, label: str) -> dict[str, tuple[str, ...]]:
    """Skills by category or keyword. Skills follow an agent's rule (``normalise_skills``), as
    an agent must be able to hold them; each entry names one at least (a keyword naming none
    masked its category's skills, leaving the task to any agent); a keyword is one word as
    ``words_of`` reads a description, or it could never match; a category is named once in any case."""
    if not isinstance(value, Mapping):
        raise ValidationError(f"skill_catalogue.{name}", f"{label}: must be an object of skill lists")
    result: dict[str, tuple[str, ...]] = {}
    for raw, skills in value.items():
        # In Unicode NFKC as descriptions are read (``skills_for``): a full-width keyword is its
        # ASCII one, and two spellings of one name are one key, refused twice below.
        key = unicodedata.normalize("NFKC", without_ignorables(str(raw)))
        where = f"skill_catalogue.{name}.{raw}"
        if not isinstance(skills, list) or not all(isinstance(s, str) and s.strip() for s in skills):
            raise ValidationError(where, f"{label}: must be a list of skill names")
        if not skills:
            raise ValidationError(where, f"{label}: must name at least one skill")
        if name == "keywords" and not WORD.fullmatch(key):
            raise ValidationError(
                where, f"{label}: a keyword is one word of ASCII letters, digits, '+', '#', '.' or '-'"
            )
        # A category in any case; a keyword as written (one holding a capital matches so only).
        written = key if name == "keywords" and not key.islower() else key.casefold()
        if written in result:
            raise ValidationError(where, f"{label}: names {written!r} twice")
        result[written] = tuple(normalise_skills(where, skills))
    return result
