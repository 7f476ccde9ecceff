"""The rule a new tenant's name follows (``require_new_tenant``), narrower than the one every
tenant's name follows (``bounds.require_tenant``), which still admits names stored before it.

A probe found ``'acme '`` (a trailing space) and a name of one zero-width space accepted as
tenants: names that look like another tenant's or like nothing in a key list, a dashboard
and a log. A new tenant's name therefore also has no whitespace at either end, holds a
visible character, and holds no Unicode format character (category Cf: zero-width spaces
and joiners, bidi controls, the soft hyphen, the byte-order mark), so that what is shown is
what is stored. It is also in its canonical form, Unicode's NFKC_Casefold (``agent.fold_text``,
as skills are compared): ``Acme`` beside ``acme``, ``café`` composed beside decomposed, the
full-width letters U+FF41... beside ``acme`` were kept as tenants apart, each with its own keys
and data, though read alike. Such a name is refused, saying the canonical form, rather than
silently folded: a key or engine that names it would otherwise reach another tenant's data.
Data already stored under a name outside this rule stays readable and
writable: the rule is applied where a tenant is first named (an API key made, an engine
started for a tenant that holds nothing yet), never where an existing one is read.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from flowledger.domain.agent import fold_text
from flowledger.domain.bounds import require_name, require_tenant
from flowledger.domain.errors import ValidationError

_RULE = "a new tenant's name"


def require_new_tenant(value: Any) -> str:
    """Raise ValidationError (field ``tenant``) unless ``value`` may name a new tenant: a tenant's
    name (``require_tenant``) with a visible character, no whitespace at either end nor two
    spaces in a row, no format character (category Cf), in its canonical form (``fold_text``:
    NFKC, case folded)."""
    name = require_tenant(value)
    if name != name.strip():
        raise ValidationError("tenant", f"{_RULE} must not start or end with whitespace, got {name!r}")
    try:
        require_name("tenant", name)
    except ValidationError:
        raise ValidationError(
            "tenant", f"{_RULE} must hold a visible character, not only ones drawn as nothing, got {name!r}"
        ) from None
    if "  " in name:
        # (As a new session's id: ``bounds.require_id``.) Other white space NFKC makes a space.
        single = " ".join(part for part in name.split(" ") if part)
        raise ValidationError(
            "tenant", f"{_RULE} must not hold two spaces in a row: it would read as {single!r}, got {name!r}"
        )
    if not name.isascii():
        for char in name:
            if unicodedata.category(char) == "Cf":
                raise ValidationError(
                    "tenant",
                    f"{_RULE} must not contain format characters (found U+{ord(char):04X}, drawn as nothing)",
                )
    canonical = name.lower() if name.isascii() else fold_text(name)
    if canonical != name:
        # Beyond case (a decomposed accent, a full-width letter, a ligature) the two are drawn
        # alike or nearly: then both are spelt as escapes.
        alike = unicodedata.normalize("NFKC", name) != name
        given, told = (ascii(name), ascii(canonical)) if alike else (repr(name), repr(canonical))
        raise ValidationError(
            "tenant",
            f"{_RULE} must be in its canonical form (Unicode NFKC, case folded: names that differ"
            f" only so read alike), got {given}: name it {told}",
        )
    return name


def new_tenant_refusal(value: str) -> ValidationError | None:
    """Why ``value`` (a tenant's name) may not name a new tenant, else None."""
    try:
        require_new_tenant(value)
    except ValidationError as refused:
        return refused
    return None
