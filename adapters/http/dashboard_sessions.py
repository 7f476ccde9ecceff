"""The dashboard's sign-in: its cookie carries a session derived from the key, never the key.

A session reads ``fls1.<key id>.<until>.<mac>``: the key's id, the Unix second it ends, and an
HMAC-SHA256 over both keyed by the digest of the key's token (what the key store keeps, so no
other secret is needed and every server of one database agrees). Each request checks it
against the key as stored now: a revoked or expired key ends its sessions, a stolen cookie
opens the dashboard as a reader until ``until`` at most, and it is no API key (the API takes
keys only). Signing out ends it on the server too: the key's row keeps the latest ``until``
signed out (``sessions_ended_until``), and a session of that key ending at or before it is
refused by every server, so a copy of the cookie dies with the sign-out.
"""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "fls1"
SESSION_S = 8 * 3600
"""How long a sign-in lasts (the cookie's max-age too)."""

_SHAPE = re.compile(r"fls1\.([A-Za-z0-9-]{1,40})\.(\d{1,12})\.([0-9a-f]{64})")


def _mac(stored_digest: bytes, key_id: str, until: int) -> str:
    message = f"flowledger dashboard session|{key_id}|{until}".encode()
    return hmac.new(stored_digest, message, hashlib.sha256).hexdigest()


def session_for(key_id: str, stored_digest: bytes, now: float, *, signed_out_until: int | None = None) -> str:
    """A session of the key ``key_id`` (whose token's digest is ``stored_digest``) from ``now``;
    it ends after ``signed_out_until`` when one is given (a sign-in in the second of a sign-out
    would otherwise be the very session signed out, and refused)."""
    until = int(now) + SESSION_S
    if signed_out_until is not None:
        until = max(until, signed_out_until + 1)
    return f"{PREFIX}.{key_id}.{until}.{_mac(stored_digest, key_id, until)}"


def session_key_id(value: str, now: float) -> str | None:
    """The key id a session names, if it is shaped as one and has not ended; its MAC is not
    checked yet (``session_matches``, once the key's digest is known)."""
    match = _SHAPE.fullmatch(value)
    if match is None or int(match.group(2)) <= now:
        return None
    return match.group(1)


def session_until(value: str) -> int:
    """The Unix second a session (shaped as one: ``session_key_id``) ends."""
    match = _SHAPE.fullmatch(value)
    if match is None:
        raise ValueError("not a dashboard session")
    return int(match.group(2))


def session_matches(value: str, stored_digest: bytes) -> bool:
    """Whether ``value`` was made by ``session_for`` for the key whose digest this is."""
    match = _SHAPE.fullmatch(value)
    if match is None:
        return False
    key_id, until, mac = match.group(1), int(match.group(2)), match.group(3)
    return hmac.compare_digest(_mac(stored_digest, key_id, until), mac)
