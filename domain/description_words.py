"""How the skill catalogue reads a task's description: its words, in their case as written,
and the forms a keyword may take in them (plural, made a verb, with a version joined).

Pure: ``SkillCatalogue.skills_for`` (``domain/skills.py``) matches its keywords against these.
"""

from __future__ import annotations

import re

WORD = re.compile(r"[a-z0-9][a-z0-9+#.\-]*", re.IGNORECASE)
"""One word as the catalogue reads it, and as a keyword must be written."""
_JOINS = re.compile(r"[.\-]+")


_VERB_FOLLOWERS = frozenset(
    [
        "a",
        "after",
        "ahead",
        "and",
        "away",
        "back",
        "by",
        "check",
        "down",
        "fix",
        "for",
        "forward",
        "from",
        "green",
        "home",
        "in",
        "into",
        "live",
        "look",
        "on",
        "out",
        "over",
        "public",
        "the",
        "through",
        "to",
        "up",
        "via",
        "with",
    ]
)
"""Words after which a capitalised first word of a sentence is read as a verb (``Go live``,
``Go over the logs``), not as the keyword written so (``Go service crashes``: the language)."""


_OPENERS = frozenset(".!?;:-*\u2022([{\"'\u201c\u2018\u00ab>#")
"""What a sentence, a title or a list item may begin after: its end, a bullet, a quote, a bracket."""


def _follows(word: str) -> bool:
    """True if ``word``, in any case (a title writes ``Go Live``), makes the one before it a verb."""
    return word.lower() in _VERB_FOLLOWERS


def words_of(text: str) -> set[str]:
    """The words of ``text`` the catalogue may know, in their case as written: each whole
    (``node.js``, ``c++``), without the punctuation that ends a sentence or a phrase
    (``kubernetes.``), and each part of one joined by ``.`` or ``-`` (``react-router``: react,
    router), and a compound joined by ``-`` written whole (``front-end``: frontend). A
    capitalised first word (of a sentence, a title, a bullet, a quote: ``_OPENERS``)
    followed by one of ``_VERB_FOLLOWERS`` is taken in lower case: it is capitalised for its
    place, not as a name; so is the first part of a compound of the verb (``Go-live``,
    ``Go-to-market``), wherever it stands."""
    words: set[str] = set()
    found = list(WORD.finditer(text))
    for n, match in enumerate(found):
        word = match.group()
        before = text[: match.start()].rstrip()
        follower = found[n + 1].group() if n + 1 < len(found) else ""
        if (not before or before[-1] in _OPENERS) and _follows(follower):
            word = word.lower()
        trimmed = word.rstrip(".-")
        words.update((word, trimmed))
        parts = [part for part in _JOINS.split(trimmed) if part]
        nexts = [*parts[1:], ""]
        words.update(
            part.lower() if _follows(after) else part for part, after in zip(parts, nexts, strict=True)
        )
        # A compound spelt with hyphens is also the word written whole ("front-end": frontend),
        # unless a part is a prefix ("re-act" is no react): parts of three letters or more.
        pieces = trimmed.split("-")
        if len(pieces) > 1 and all(len(piece) >= 3 for piece in pieces):
            words.add("".join(pieces))
    return words


def extensions_of(words: set[str]) -> set[str]:
    """The extensions of the file names among ``words`` (``main.go``: go), case folded: the
    last part of a word joined by ``.``, when some name stands before it."""
    ends = (word.rstrip(".").rpartition(".") for word in words)
    return {extension.casefold() for name, _, extension in ends if name.strip(".") and extension}


_VERSIONED = re.compile(r"(.*[a-z+#])[0-9]+(?:\.[0-9]+)*", re.IGNORECASE)
"""A word that is a name with a version joined to it (``vue3``, ``python3.12``, ``k8s1.29``): the
name ends in a letter, so a keyword ending in a digit (``s3``, ``ec2``) takes no version."""


def versioned(folded: set[str]) -> dict[str, str]:
    """The names among ``folded`` written with their version joined (``html5``: html; ``go1.22``:
    go), by each the longest word found so: "Migrate to Vue3" was routed by its category alone."""
    names: dict[str, str] = {}
    for word in sorted(folded, key=lambda w: (-len(w), w)):
        match = _VERSIONED.fullmatch(word)
        if match:
            names.setdefault(match[1], word)
    return names


ENDINGS = (
    "s",
    "es",
    "ize",
    "izes",
    "ized",
    "izing",
    "ization",
    "izations",
    "ise",
    "ises",
    "ised",
    "ising",
    "isation",
    "isations",
)
"""Endings a lower-case keyword is also read with: the plural, and the verb made of it with
``-ize`` / ``-ise`` and that verb's forms (``dockerize``, ``containerised``, ``containerization``).
Not ``-ed`` nor ``-ing`` alone: "composed" and "paging" would name docker and react."""


def base_words(folded: set[str]) -> dict[str, str]:
    """The words among ``folded`` that may be a keyword with one of ``ENDINGS``, by each
    base they may stand for (``containers``: container; ``ingresses``: ingresse, ingress;
    ``dockerized``: docker), so that a keyword names its stack in the plural, or made a verb,
    too: "Restart the crashed containers" and "Dockerize the service" were routed by their
    category alone."""
    bases: dict[str, str] = {}
    for word in sorted(folded):
        for ending in ENDINGS:
            if word.endswith(ending) and len(word) > len(ending) + 1:
                bases.setdefault(word[: -len(ending)], word)
    return bases
