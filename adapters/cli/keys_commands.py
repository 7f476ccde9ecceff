"""``flowledger keys create|list|revoke``: the HTTP API's keys, stored hashed in PostgreSQL."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import fail, reported_errors
from flowledger.adapters.cli.rendering import whole_cells
from flowledger.adapters.durations import parse_since
from flowledger.domain.bounds import require_tenant
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Settings
from flowledger.infrastructure.postgres.embedded import embedded_database_url
from flowledger.infrastructure.postgres.keys import (
    MAX_KEY_LIFETIME,
    ApiKey,
    PostgresKeyStore,
    StaticKeys,
    key_id_salt,
    require_lifetime,
)

if TYPE_CHECKING:
    from flowledger.adapters.http.auth import Keyring

console = cli_console()
notes = cli_console(stderr=True)
keys_app = typer.Typer(
    help="API keys of the HTTP API: create (shown once), list, revoke.", no_args_is_help=True
)


SHOWN_ID = 40
"""The most characters of a key id an error line quotes: a pasted token must not fill the screen."""


def _database_url(settings: Settings) -> str:
    return settings.database_url or embedded_database_url(settings.home)


def keyring(settings: Settings) -> Keyring:
    """The keys ``settings`` give, and the database's table unless events live in memory.

    What ``Keyring.of(engine)`` finds, without building an engine first: ``serve`` checks the keys
    before it starts anything.
    """
    from flowledger.adapters.http.auth import Keyring  # FastAPI: only ``serve`` needs it

    return Keyring.from_settings(settings, _database_url(settings))


@contextmanager
def _store() -> Iterator[PostgresKeyStore]:
    settings = Settings.from_env()
    store = PostgresKeyStore(_database_url(settings), settings.schema, settings)
    try:
        yield store
    finally:
        store.close()


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    role: Annotated[str, typer.Option(help="reader (reads, analytics), writer (and commands) or admin.")],
    label: Annotated[str, typer.Option(help="A note for whoever lists the keys.")] = "",
    expires_in: Annotated[
        str | None,
        typer.Option(
            help=f"Refuse the key after this long: 90m, 12h, 30d, 8w (at most {MAX_KEY_LIFETIME.days}d)."
            " Without it the key never expires."
        ),
    ] = None,
) -> None:
    """Create a key and print it once: only its hash is kept."""
    with reported_errors():
        lifetime = None if expires_in is None else parse_since(expires_in, field="--expires-in")
        if lifetime is not None:
            require_lifetime(lifetime, "--expires-in")
        with _store() as store:
            issued = store.create(tenant, role, label, expires_in=lifetime)
    expires = issued.key.expires_at
    until = f", until {expires.astimezone(UTC):%Y-%m-%d %H:%M} UTC" if expires else ""
    notes.print(f"key {issued.key.key_id} for {tenant!r} as {role}{until}, shown this once:", highlight=False)
    print(issued.token)


@keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    revoked: Annotated[bool, typer.Option("--revoked", help="Include revoked keys.")] = False,
) -> None:
    """The keys, without their secrets; ``expires`` says when each stops working (``expired``
    once it has: it is still listed until revoked)."""
    with reported_errors():
        if tenant is not None:
            require_tenant(tenant)
        with _store() as store:
            keys = store.list(tenant, revoked=revoked)
    table = Table(title="API keys")
    now = datetime.now(UTC)
    for column in ("key id", "tenant", "role", "label", "created", "expires", "revoked"):
        table.add_column(column)
    for key in keys:
        table.add_row(
            key.key_id,
            key.tenant,
            key.role,
            key.label,
            f"{key.created_at:%Y-%m-%d %H:%M}" if key.created_at else "",
            _expiry(key, now),
            f"{key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "",
        )
    console.print(whole_cells(table))


def _expiry(key: ApiKey, now: datetime) -> str:
    """A key's expiry as listed: ``never``, the time in UTC, and ``(expired)`` once past."""
    if key.expires_at is None:
        return "never"
    shown = f"{key.expires_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
    return f"{shown} (expired)" if key.expired(now) else shown


@keys_app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="The key's id, as listed.")]) -> None:
    """Revoke a key: every server refuses it from its next request. A key of
    ``FLOWLEDGER_API_KEYS`` is not stored: the command says so (exit 3)."""
    with reported_errors():
        if not key_id.strip():  # an unset shell variable: a mistake, not a key that is not there
            raise ValidationError("key_id", "must be a non-empty string")
        settings = Settings.from_env()
        with _store() as store:
            found = store.revoke(key_id)
            given = StaticKeys(settings.api_keys, salt=key_id_salt(settings, store))
    if not found and given.by_id(key_id) is not None:
        fail(
            f"key {key_id!r} is given in FLOWLEDGER_API_KEYS, not stored: remove it there and restart the"
            " servers that read it",
            3,
        )
    former = None if found else given.by_former_id(key_id)
    if former is not None:
        fail(
            f"{key_id!r} is the id recorded before ids were salted of the key now listed as"
            f" {former.key_id!r}, given in FLOWLEDGER_API_KEYS, not stored: remove it there and"
            " restart the servers that read it",
            3,
        )
    if not found:
        shown = (
            repr(key_id) if len(key_id) <= SHOWN_ID else f"{key_id[:SHOWN_ID]!r}… ({len(key_id)} characters)"
        )
        fail(f"no active key {shown}", 3)
    console.print(f"key {key_id} revoked", highlight=False)


def keys_required(host: str, keys: Keyring, *, insecure: bool, console: Console) -> bool:
    """Whether requests need a key: yes when any exists; with none, only loopback may be served open."""
    if keys.any_configured():
        return True
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not insecure:
        raise typer.BadParameter(
            f"no API key is configured: refusing to serve {host or 'every interface'} to the network open. "
            "Create one (flowledger keys create --tenant T --role writer), set FLOWLEDGER_API_KEYS, "
            "or pass --insecure",
            param_hint="--host",
        )
    console.print(
        f"[yellow]no API key configured: {host} is served open (every caller is admin)"
        " until a key is created[/yellow]"
    )
    return False


def register(app: typer.Typer) -> None:
    """Add ``keys`` to the top-level app."""
    app.add_typer(keys_app, name="keys")
