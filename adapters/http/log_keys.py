"""What the access log keeps of a request's path and id: never an API key sent in them.

A client that pastes a key where an id goes (``/v1/sessions/<key>``, ``X-Request-Id: <key>``:
a template's variables swapped) had it written to the log, and the id echoed in every
answer's ``X-Request-Id``. The log masks the keys the request carries in its headers and
anything shaped as a stored key (``flk_<id>_<secret>``), whoever's it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from flowledger.infrastructure.settings import MIN_SECRET_LENGTH

MASK = "<key>"
_STORED = re.compile(r"flk_[a-z0-9]{12}_[A-Za-z0-9_-]{43}")
"""A stored key's token (``infrastructure/postgres/keys.py``), found anywhere in a text."""


def sent_keys(headers: Iterable[tuple[bytes, bytes]]) -> set[str]:
    """The keys a request's raw headers carry (``Authorization: Bearer`` and ``X-API-Key``) long
    enough to be one: shorter ones are no key (``MIN_SECRET_LENGTH``), and masking them would
    mask ordinary words of a path."""
    found = set()
    for name, raw in headers:
        value = raw.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, value = value.partition(" ")
            value = value.strip() if scheme.lower() == "bearer" else ""
        elif name != b"x-api-key":
            continue
        if len(value) >= MIN_SECRET_LENGTH:
            found.add(value)
    return found


def without_keys(text: str, sent: set[str]) -> str:
    """``text`` with every key in ``sent`` and every stored key's shape replaced by ``MASK``."""
    for key in sorted(sent, key=len, reverse=True):
        text = text.replace(key, MASK)
    return _STORED.sub(MASK, text)
