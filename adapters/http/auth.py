"""Who is calling: API keys to tenants and roles, one engine per tenant, the per-key rate.

Every route but ``/healthz``, ``/readyz``, the OpenAPI document and its pages (``/docs``,
``/redoc`` and their scripts) asks for a key
(``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; the dashboard page also takes
the login form's cookie). A key names a tenant and a role; the caller's commands run on
that tenant's engine, acting as the key (its id is recorded on every event written), so a
session or task of another tenant is simply not found. With no key configured anywhere the
app runs *open*: every request is the default tenant's admin (``serve`` allows that on
loopback only, or with ``--insecure``).
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.dependencies.models import Dependant
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.http.dashboard_sessions import session_key_id, session_matches, session_until
from flowledger.adapters.http.guesses import Guesses, retry_after
from flowledger.adapters.http.tenants import Tenants
from flowledger.domain.errors import StoreRefused, StoreUnavailable
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.keys import (
    ROLES,
    ApiKey,
    PostgresKeyStore,
    StaticKeys,
    digest,
    key_id_salt,
)
from flowledger.infrastructure.settings import MEMORY_URL

COOKIE = "flowledger_key"
"""The dashboard login's cookie (HttpOnly, SameSite=Strict, path /dashboard)."""
UNKNOWN_KEY = "this API key is unknown or revoked"
EXPIRED_KEY = "this API key has expired: ask for a new one"
"""The 401 of a key whose ``expires_at`` has passed: only the holder of the whole token gets it."""
TOO_MANY_REFUSED = "too many refused API keys from this address: retry later"
OPEN_RECHECK_S = 1.0
"""How often an app that runs open because no key existed asks whether one does now: the first
key created closes it within this, where it stayed open until a restart."""

bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer flk_...`")
api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="An API key, for tools that cannot send bearer"
)


def rank(role: str) -> int:
    """reader < writer < admin."""
    return ROLES.index(role)


class Keyring:
    """Finds the key a token belongs to: keys from the environment, then the database's.

    A stored key is looked up at each request (one query by primary key on the store's own
    pool), never cached: a revocation is refused by every server at once, as the dashboard's
    sessions already were (a 5-second cache of good keys let a revoked key act for seconds)."""

    def __init__(self, static: StaticKeys, store: PostgresKeyStore | None) -> None:
        self.static = static
        self.store = store
        self._signed_out: dict[str, int] = {}
        """Sign-outs of the environment's keys (``end_session``), by key id."""

    @classmethod
    def of(cls, engine: Engine) -> Keyring:
        """The keys ``engine``'s settings give, and its database's table when it has one."""
        return cls.from_settings(engine.settings, engine.database_url)

    @classmethod
    def from_settings(cls, settings: Settings, database_url: str) -> Keyring:
        """The keys ``settings`` give, and the table in ``database_url`` unless events live in
        memory: what ``of`` finds, without an engine (``serve`` checks keys before it starts one)."""
        store = (
            None if database_url == MEMORY_URL else PostgresKeyStore(database_url, settings.schema, settings)
        )
        return cls(StaticKeys(settings.api_keys, salt=key_id_salt(settings, store)), store)

    def any_configured(self) -> bool:
        """Whether any key exists, or existed and was revoked (blocking: asks the database)."""
        return len(self.static) > 0 or (self.store is not None and self.store.has_keys())

    def find(self, token: str) -> ApiKey | None:
        """The key as stored now, revoked or not, or None when the token is no key's (blocking:
        asks the database for a token shaped as a stored key's)."""
        key = self.static.find(token)
        if key is not None or self.store is None:
            return key
        return self.store.lookup(token)

    def find_session(self, value: str) -> ApiKey | None:
        """The key a dashboard session names, as a reader, when the session is one this server's
        keys made and has neither ended nor been signed out, else None (blocking: asks the
        database for the key as it stands, revoked or expired keys included; the gate judges
        those)."""
        key = self._session_key(value)
        if key is None:
            return None
        if session_until(value) <= (self.signed_out_until(key) or 0):
            return None
        return replace(key, role="reader")

    def _session_key(self, value: str) -> ApiKey | None:
        """The key a session names, when its MAC is that key's and it has not ended."""
        key_id = session_key_id(value, time.time())
        if key_id is None:
            return None
        found = self.static.by_id(key_id)
        if found is None and self.store is not None:
            found = self.store.by_id(key_id)
        if found is None or not session_matches(value, found[1]):
            return None
        return found[0]

    def signed_out_until(self, key: ApiKey) -> int | None:
        """The latest end of a signed-out dashboard session of ``key`` (as read with it), if any."""
        if key.key_id in self._signed_out:  # a key of the environment: no row to keep it in
            return self._signed_out[key.key_id]
        return key.sessions_ended_until

    def session_mark(self, key_id: str) -> int | None:
        """What ``signed_out_until`` says of the key ``key_id`` now (blocking), for a new sign-in."""
        found = self.static.by_id(key_id)
        if found is None and self.store is not None:
            found = self.store.by_id(key_id)
        return None if found is None else self.signed_out_until(found[0])

    def end_session(self, value: str) -> None:
        """Sign out the dashboard session ``value`` (and those of its key made before it), on every
        server of the database; nothing for a value that is no current session (blocking). A key
        of ``FLOWLEDGER_API_KEYS`` has no row: its sign-outs are kept by this server alone."""
        key = self._session_key(value)
        if key is None:
            return
        until = session_until(value)
        if self.store is not None and self.static.by_id(key.key_id) is None:
            self.store.end_sessions(key.key_id, until)
        else:
            self._signed_out[key.key_id] = max(until, self._signed_out.get(key.key_id, 0))

    def close(self) -> None:
        """Close the database connections."""
        if self.store is not None:
            self.store.close()


class RateLimits:
    """A token bucket per key: ``burst`` requests at once, refilled at ``rate`` per second."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: str) -> float:
        """0 when the request may go ahead, else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.get(key_id, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            if tokens >= 1.0:
                self._buckets[key_id] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key_id] = (tokens, now)
            return (1.0 - tokens) / self.rate


@dataclass(frozen=True)
class Caller:
    """The authenticated caller: the key (None when the app runs open), its tenant's engine, its role."""

    key_id: str | None
    tenant: str
    role: str
    engine: Engine

    def require(self, role: str) -> None:
        """403 unless this caller's role includes ``role``."""
        require_role(self.role, role)

    @contextmanager
    def acting(self) -> Iterator[None]:
        """Events written inside record this caller's key id."""
        if self.key_id is None:
            yield
            return
        with self.engine.acting_as(self.key_id):
            yield


def require_role(has: str, needs: str) -> None:
    """403 unless the role ``has`` includes the role ``needs``."""
    if rank(has) < rank(needs):
        raise HTTPException(403, f"this API key's role ({has}) may not do this: it needs {needs}")


class Gate:
    """Admits a request: finds its key, checks the role, takes from the key's rate bucket, and
    holds its tenant's engine for it (``release`` gives it back)."""

    def __init__(
        self,
        tenants: Tenants,
        keys: Keyring,
        limits: RateLimits,
        *,
        open_: bool,
        local_only: bool = False,
        guesses: Guesses | None = None,
        close_on_key: bool = False,
    ) -> None:
        """``close_on_key``: the app runs open because no key existed, and closes for good once
        one does (asked every ``OPEN_RECHECK_S`` while open)."""
        self.tenants, self.keys, self.limits, self.open = tenants, keys, limits, open_
        self.local_only = local_only
        self.close_on_key = close_on_key
        self._next_key_check = 0.0
        settings = tenants.base.settings
        self.guesses = guesses or Guesses(settings.http_auth_failures, settings.http_auth_failure_window_s)

    async def admit(self, request: Request, token: str | None, role: str, *, session: bool = False) -> Caller:
        """The caller, or 401 (no, unknown or expired key), 403 (role, or a Host that is not this
        machine to an app open to local callers only), 429 (the key's rate, or too many refused
        keys from the caller's address). ``session``: ``token`` is the dashboard's sign-in
        cookie (``dashboard_sessions.py``), which acts as its key's reader."""
        if self.open and self.close_on_key:
            await self._close_once_keyed(request)
        if self.open:
            host = request.headers.get("host", "")
            if self.local_only and not loopback_host(host):
                # A page on another site can reach a loopback server through DNS rebinding (its
                # name made to resolve to 127.0.0.1): the browser then sends that name as Host.
                raise HTTPException(
                    403,
                    "this server runs without API keys for callers on this machine only, and the"
                    " Host header names another: open it as localhost or 127.0.0.1, or create a key",
                )
            base = self.tenants.base
            return Caller(None, base.tenant, "admin", base)
        key = await self.known(request, token, session=session)
        request.state.key_id, request.state.tenant = key.key_id, key.tenant
        wait = self.limits.take(key.key_id)
        if wait > 0:
            raise HTTPException(
                429,
                f"rate limit of this API key reached ({self.limits.rate:g} requests/s): retry later",
                headers={"Retry-After": str(max(1, int(wait + 0.999)))},
            )
        require_role(key.role, role)  # before the engine is taken: a 403 holds none
        tenants = self.tenants
        # Held here, in the request's task, with no wait between this and the caller's release;
        # a tenant not seen lately is made first in a thread (its name may be checked in the database).
        while (engine := tenants.acquire_kept(key.tenant)) is None:
            await run_in_threadpool(tenants.prepare, key.tenant)
        return Caller(key.key_id, key.tenant, key.role, engine)

    async def _close_once_keyed(self, request: Request) -> None:
        """Close the app when a key exists now (asked at most every ``OPEN_RECHECK_S``): a key
        created while it ran open took effect only at a restart, so the keys handed out guarded
        nothing. A database that cannot be asked leaves it as it is, asked again next time; when
        it is unreachable, the request is answered so at once (``StoreUnavailable``: 503 with
        Retry-After), its own reads meeting the same outage: going on, it waited the operation's
        deadline a second time (an outside probe, `serve` with no key, a 3 s deadline: every
        request in an outage answered after 6 s). The outage is told as the request's own
        (``GET /v1/agents``), as the request would have met it: it said "(api keys)", the key
        table's pool, to a caller that sent no key to a server that asks for none."""
        now = time.monotonic()
        if now < self._next_key_check:
            return
        self._next_key_check = now + OPEN_RECHECK_S
        try:
            keyed = await run_in_threadpool(self.keys.any_configured)
        except StoreRefused:
            return  # not an outage: the request's own call says what it meets
        except StoreUnavailable as outage:
            operation = f"{request.method} {request.url.path}"
            raise StoreUnavailable(operation, outage.detail, outage.retry_after) from outage
        except Exception:
            return
        if keyed:
            self.open = False

    def release(self, caller: Caller) -> None:
        """The request of ``caller`` (from ``admit``) is done with its tenant's engine."""
        self.tenants.release(caller.tenant)

    async def known(self, request: Request, token: str | None, *, session: bool = False) -> ApiKey:
        """The key ``token`` names, or 401 (none sent, or unknown, revoked or expired), or 429
        before any lookup when the caller's address has sent too many refused keys (``Guesses``):
        a valid key from that address is refused too until the address's window ends, since
        telling it from a guess would take the lookup the limit is there to spare."""
        if not token:
            raise HTTPException(401, no_key_said(request), headers={"WWW-Authenticate": "Bearer"})
        address, held = request.client.host if request.client else None, digest(token)
        wait = self.guesses.admit(address, held)
        if wait > 0:
            raise HTTPException(429, TOO_MANY_REFUSED, headers={"Retry-After": retry_after(wait)})
        try:
            key = await run_in_threadpool(self.keys.find_session if session else self.keys.find, token)
        except BaseException as error:  # the database's fault (or a cancelled request), not a guess
            self.guesses.settle(address, held, refused=False)
            if isinstance(error, StoreUnavailable) and not isinstance(error, StoreRefused):
                # Said what was being done: it said "(api keys)", the key table's pool.
                operation = f"checking the API key of {request.method} {request.url.path}"
                raise StoreUnavailable(operation, error.detail, error.retry_after) from error
            raise
        # No key: a guess, or a mistyped key, counted against the address.
        self.guesses.settle(address, held, refused=key is None)
        if key is None:
            raise HTTPException(401, UNKNOWN_KEY, headers={"WWW-Authenticate": "Bearer"})
        # A revoked or expired key is refused without counting: its holder has a real token (a
        # client left with a stale key must not lock its address's other keys out). Judged here,
        # at each request, from the row as it stands.
        if key.revoked_at is not None:
            raise HTTPException(401, UNKNOWN_KEY, headers={"WWW-Authenticate": "Bearer"})
        # By the engine's clock (the database's): the one the key's expiry was set by.
        if key.expired(self.tenants.base.clock()):
            raise HTTPException(401, EXPIRED_KEY, headers={"WWW-Authenticate": "Bearer"})
        self.guesses.served(address, held)
        return key


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,19}")
"""What is quoted of an Authorization header's scheme: a word (a key's characters run longer)."""


def no_key_said(request: Request) -> str:
    """The 401 of a request that carries no key: what its Authorization header lacks, if it sent
    one (a key sent without 'Bearer ' was told only that a key is required), never its value."""
    send = "send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
    sent = [value.strip() for value in request.headers.getlist("authorization") if value.strip()]
    if not sent:
        return f"an API key is required: {send}"
    scheme, _, rest = sent[0].partition(" ")
    if scheme.lower() == "bearer":
        lacks = "no key after 'Bearer'"
    elif rest.strip() and _SCHEME.fullmatch(scheme):
        lacks = f"the scheme {scheme!r}, not Bearer"
    else:
        lacks = "no scheme: a key goes after 'Bearer '"
    return f"an API key is required (the Authorization header has {lacks}): {send}"


def loopback_host(host: str) -> bool:
    """Whether a Host header names this machine: ``localhost`` or a loopback address, any port."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name in {"localhost", "localhost."}:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


async def refusal_before_body(request: Request) -> HTTPException | None:
    """The 401 owed to a request whose body could not be read, when its route needs a key and it
    carries none or an unknown one, or the 403 when its key's role may not call the route (None
    otherwise). FastAPI reads the body before the route's dependencies run, so without this a
    caller with no key, or a reader calling a writer's route, was told what is wrong with its body."""
    gate: Gate = request.app.state.gate
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if gate.open or not _reads_key(dependant):
        return None
    try:
        key = await gate.known(request, token_of(request))
        require_role(key.role, _role_needed(dependant))
    except HTTPException as refusal:
        return refusal
    return None


_ROLE_OF: dict[Callable[..., AsyncIterator[Caller]], str] = {}
"""The role each ``requires`` dependency admits, for ``refusal_before_body``."""


def _role_needed(dependant: Dependant | None) -> str:
    """The highest role a route's dependencies ask for (``reader`` when none says)."""
    if dependant is None:
        return "reader"
    roles = [_ROLE_OF[needed.call] for needed in dependant.dependencies if needed.call in _ROLE_OF]
    roles += [_role_needed(needed) for needed in dependant.dependencies]
    return max(roles, key=rank, default="reader")


def _reads_key(dependant: Dependant | None) -> bool:
    """Whether a route's dependencies read an API key (those admitted through ``requires``)."""
    return dependant is not None and any(
        needed.call is bearer or _reads_key(needed) for needed in dependant.dependencies
    )


def token_of(request: Request) -> str | None:
    """The key a request carries, as a bearer token or ``X-API-Key``, without the spaces around it
    (HTTP says they are not part of a header's value; httptools leaves trailing ones in); 401 when
    it carries two different keys, in the two headers or in one of them sent twice (which one
    acts would be a guess: another tenant's, say). An ``Authorization`` header of another scheme
    (a proxy's ``Basic``) is not a key."""
    sent = [_bearer_token(value) for value in request.headers.getlist("authorization")]
    sent += [value.strip() for value in request.headers.getlist("x-api-key")]
    keys = {key for key in sent if key}
    if len(keys) > 1:
        raise HTTPException(
            401,
            "two different API keys were sent (in Authorization: Bearer and X-API-Key, or in one"
            " of them twice): send one",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return keys.pop() if keys else None


def sessions_sent(request: Request) -> set[str]:
    """Every dashboard sign-in the request's cookies carry (a browser sends a cookie once per
    domain and path it was set for, so there may be several)."""
    sent = set()
    for header in request.headers.getlist("cookie"):
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name.strip() == COOKIE and value.strip().strip('"'):
                sent.add(value.strip().strip('"'))
    return sent


def session_of(request: Request) -> str | None:
    """The dashboard sign-in the request's cookies carry, or None; 401 when they carry two
    different ones (another site's sibling can set a cookie for ``/dashboard``: the last one
    sent acted, so a tossed sign-in showed its tenant's page in place of the browser's own)."""
    sent = sessions_sent(request)
    if len(sent) > 1:
        raise HTTPException(401, "two different dashboard sign-ins were sent: sign out and sign in again")
    return sent.pop() if sent else None


def _bearer_token(authorization: str) -> str | None:
    """The token of ``Bearer <token>`` (the scheme in any case, any spaces), else None."""
    parts = authorization.split(None, 1)
    return parts[1].strip() if len(parts) == 2 and parts[0].lower() == "bearer" else None


def requires(role: str) -> Callable[..., AsyncIterator[Caller]]:
    """A dependency admitting callers whose role includes ``role``.

    It sets the actor for the rest of the request: an async dependency runs in the
    request's own task, whose context FastAPI copies into the worker thread of a sync
    endpoint, so ``acting_as``'s contextvar is seen by the engine call.
    """

    async def dependency(
        request: Request,
        # Declared for the OpenAPI document's security schemes; ``token_of`` reads every header
        # itself (these see only the first of a header sent twice).
        _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
        _header_key: Annotated[str | None, Security(api_key_header)],
    ) -> AsyncIterator[Caller]:
        gate: Gate = request.app.state.gate
        caller = await gate.admit(request, token_of(request), role)
        try:
            with caller.acting():
                yield caller
        finally:  # the tenant's engine may be closed (``Tenants``) once no request holds it
            gate.release(caller)

    _ROLE_OF[dependency] = role
    return dependency


Reader = Annotated[Caller, Depends(requires("reader"))]
Writer = Annotated[Caller, Depends(requires("writer"))]
