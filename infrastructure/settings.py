"""Settings, read once from the environment (or given as arguments) where the engine is built."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from flowledger.domain.bounds import require_flag, require_tenant, shown
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure.variables import refuse_misspelt_variables

MEMORY_URL = "memory:"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A plain lower-case SQL name, matched whole (``fullmatch``: "$" matched before a trailing line
break, and "flowledger\\n" was made as a schema of its own)."""
MAX_SCHEMA_LENGTH = 42
"""The longest schema name whose derived schemas fit PostgreSQL's 63 characters: the projections
name theirs after it (``projections.catalog.Names``), ``<schema>_current_state_verify`` the
longest (21 more). A 63-character schema migrated and took steps, and every rebuild failed."""
_SYSTEM_SCHEMA = (
    "is PostgreSQL's own (information_schema, or a name beginning pg_): pg_dump leaves such"
    " schemas out, so the log would be in no backup; choose another name"
)
"""A superuser's ``migrate`` made the whole log in ``information_schema``, which pg_dump never
dumps; ``pg_*`` stopped it with the server's "unacceptable schema name" (exit 1)."""
MAX_EVENT_PARTITIONS = 1024
"""The most hash partitions ``event_partitions`` may ask for."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the engine is configured with. Nothing else reads the environment."""

    database_url: str | None = None
    read_database_url: str | None = None
    """A streaming replica (hot standby) of ``database_url`` that the dashboards, the funnel and the
    dashboard page read (``FLOWLEDGER_READ_DATABASE_URL``); they then read what it has replayed and
    do not catch the projections up themselves: a ``projections follow`` keeps them current,
    reading the log from ``database_url`` and writing there (docs/projections.md, Replicas)."""
    home: Path = Path.home() / ".local" / "share" / "flowledger"
    schema: str = "flowledger"
    tenant: str = "default"
    llm_base_url: str | None = None
    llm_api_key: str | None = field(default=None, repr=False)
    pricing_file: Path | None = None
    skill_catalogue_file: Path | None = None
    """The skill catalogue (``infrastructure/skills.json`` when None): skills by category and word."""
    routing_file: Path | None = None
    """Model tiers by priority (``infrastructure/routing.json`` when None)."""
    snapshot_interval: int = 50
    max_conflict_retries: int = 256
    """Optimistic-concurrency retries per command (jittered backoff) before ConcurrentUpdate:
    about the operation's deadline at the backoff's cap. 64 ended 1-5 calls in 640 of 64
    engines writing one session at once; 256 none of 1,920 (nor of 576 from 96 engines)."""
    pool_size: int = 20
    write_cache_size: int = 10_000
    write_cache_bytes: int = 268_435_456
    """The most the aggregates in an engine's write cache may hold together, as reckoned by
    ``engine/cache_weights.py`` (their JSON size, about what their snapshots take; 0: cache
    nothing). Bounded by count alone, 10,000 sessions holding 1 MB contexts each would keep
    about 10 GB (``FLOWLEDGER_WRITE_CACHE_BYTES``)."""
    connect_timeout_s: float = 3.0
    """Deadline for opening one database connection."""
    pool_timeout_s: float = 5.0
    """Deadline for taking a connection from the pool."""
    statement_timeout_s: float = 10.0
    """Deadline for one SQL statement (server side); a statement still running when its
    operation's deadline passes is cancelled, then cut off, client side (``postgres/watchdog.py``)."""
    operation_deadline_s: float = 15.0
    """Deadline for one engine operation with its retries; past it, StoreUnavailable."""
    step_lease_s: float = 15.0
    """How long a started step's worker holds its idempotency key without renewing it."""
    classify_lock_wait_s: float = 60.0
    """How long a classify waits for another engine's classification of the task to end before
    it calls the model anyway (``FLOWLEDGER_CLASSIFY_LOCK_WAIT_S``): a stalled engine holds
    nobody back for longer."""
    pgbouncer: bool = False
    """PgBouncer (any pool_mode; it takes no startup options) sits between: no server-side prepared
    statements, no session SET."""
    api_keys: tuple[tuple[str, str, str], ...] = field(default=(), repr=False)
    """HTTP API keys given in the environment, as (tenant, role, secret); more live in the database."""
    http_max_body_bytes: int = 1_048_576
    """The largest request body the HTTP API reads; a larger one is answered 413."""
    http_rate_per_s: float = 50.0
    """Requests per second each API key may make (sustained); past it, 429 with Retry-After."""
    http_rate_burst: int = 100
    """Requests an API key may make at once before the rate applies."""
    http_max_tenant_engines: int = 256
    """The most tenants' engines the HTTP service keeps (``FLOWLEDGER_HTTP_MAX_TENANT_ENGINES``):
    past it the least recently used one no request holds is closed, and made again on its
    tenant's next request (``adapters/http/tenants.py``)."""
    http_auth_failures: int = 20
    """Refused keys one client address may send in ``http_auth_failure_window_s``; past them its
    requests are answered 429 without their key being looked up, until the window ends."""
    http_auth_failure_window_s: float = 60.0
    """The window of ``http_auth_failures``, from an address's first refused key."""
    ready_timeout_s: float = 2.0
    """How long ``/readyz`` waits for the database before answering 503."""
    agent_locks: bool = True
    """Assigners in different processes take turns per agent (PostgreSQL advisory locks);
    off (``FLOWLEDGER_AGENT_LOCKS=0``) they race and the losers retry."""
    group_commit: bool = False
    """Concurrent saves in one process share transactions (``postgres/group_commit.py``,
    ``FLOWLEDGER_GROUP_COMMIT=1``); off by default until a full test run with it on: measured,
    it pays with 8 or more writers when commits are fast, not with one (bench/README.md,
    "Group commit")."""
    group_commit_leaders: int = 2
    """With group commit, how many shared transactions may be in flight at once
    (``FLOWLEDGER_GROUP_COMMIT_LEADERS``)."""
    dashboard_url_keys: bool = False
    """Accept an API key in the dashboard page's URL (``?key=``); off: the login form's cookie only."""
    audit_chain: bool = True
    """Chain every appended event (hash and keyed seal, docs/audit.md); off: rows are stored unchained."""
    audit_key_dir: Path | None = None
    """Where the chain key and the checkpoint signing key live (made 0600 on first use); None: home/keys."""
    chain_key: bytes | None = field(default=None, repr=False)
    """The chain's HMAC key (``FLOWLEDGER_CHAIN_KEY``, hex); None: the key file in ``key_dir``."""
    chain_key_replaced: bool = False
    """Start with a chain key that seals none of the log's newest rows (made when missing): the
    writers' key was lost for good (``FLOWLEDGER_CHAIN_KEY_REPLACED=1``; old seals then read as
    forged). Off, such an engine refuses to start (``postgres/chain_key_check.py``)."""
    signing_key: bytes | None = field(default=None, repr=False)
    """The checkpoints' Ed25519 private key, 32 bytes (``FLOWLEDGER_SIGNING_KEY``, hex); None: its file."""
    checkpoint_every_events: int = 10_000
    """An engine takes a signed checkpoint after it appended this many events (0: never by count)."""
    checkpoint_every_s: float = 300.0
    """... or when this many seconds passed since its last one and it appended since (0: never by time)."""
    webhook_allow_private: bool = False
    """Budget alert webhooks may call loopback, private and link-local addresses
    (``FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE=1``); off: such a destination is refused when a budget is
    set over HTTP and never called (``adapters/llm/alerts.py``)."""
    webhook_strict: bool = False
    """``/webhook/workflow-state`` in strict mode by default (no input merge, no restart, 400 for an
    unknown action); off: the seed's behaviour. A request's ``"strict"`` field overrides it."""
    seal_personal_data: bool = False
    """Encrypt new sessions' personal fields under per-session data keys, so ``forget`` can erase
    them (``infrastructure/sealing.py``). Off by default: with 8 writers it cost more than 10 % of
    ``record_step`` (bench/README.md, ``bench_sealing.py``)."""
    data_key_cache_s: float = 30.0
    """How long an engine trusts a data key it read: ``forget`` takes effect on other engines within it."""
    event_partitions: int | None = None
    """Hash partitions of the events table by stream (``FLOWLEDGER_EVENT_PARTITIONS``; 0: one
    unpartitioned table). A new schema is made so; ``flowledger migrate`` converts an existing
    log to it (docs/recorder.md, "Partitioned log"); an engine start never converts. None
    (unset): new schemas get one table, and an existing log keeps the layout it has."""

    def __post_init__(self) -> None:
        for (
            name
        ) in _PATHS:  # text is a path (the environment's is); "/srv/x" raised TypeError at the first write
            value = getattr(self, name)
            if isinstance(value, str | os.PathLike) and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
            elif value is not None and not isinstance(value, Path):
                raise ValidationError(name, f"must be a path, got {type(value).__name__}")
        if not isinstance(self.schema, str) or not _SCHEMA_NAME.fullmatch(self.schema):
            raise ValidationError("schema", f"{shown(self.schema)} is not a plain lower-case SQL name")
        if len(self.schema) > MAX_SCHEMA_LENGTH:
            raise ValidationError(
                "schema",
                f"{self.schema!r} is {len(self.schema)} characters long; at most {MAX_SCHEMA_LENGTH}:"
                " the read models' schemas are named after it ('<schema>_current_state_verify' the"
                " longest) and PostgreSQL names have at most 63",
            )
        if self.schema == "information_schema" or self.schema.startswith("pg_"):
            raise ValidationError("schema", f"{self.schema!r} {_SYSTEM_SCHEMA}")
        require_tenant(self.tenant)  # not blank, no control characters, at most 200 (as a key's)
        object.__setattr__(self, "api_keys", _key_triples("api_keys", self.api_keys))
        _require_usable_secrets("api_keys", self.api_keys)
        _require_keys(self)
        if self.database_url is not None and self.database_url != MEMORY_URL:
            _require_conninfo("database_url", self.database_url)
        # Given as arguments, not read from the environment: checked as ``_count``/``_seconds``
        # check the variables ("x" failed at the first comparison, NaN waited for ever).
        for name in _FLAGS:  # "no" and "false" are true in Python: a flag the caller turned off was on
            require_flag(name, getattr(self, name))
        for name in _WHOLE_NUMBERS:
            value = getattr(self, name)
            if type(value) is not int:
                raise ValidationError(name, f"must be a whole number, got {shown(value)}")
        for name in ("write_cache_size", "write_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValidationError(name, f"must be >= 0, got {getattr(self, name)}")
        for name in _COUNTS:  # as ``_count`` reads their variables: a burst of 0 was a 429 for ever
            if getattr(self, name) < 1:
                raise ValidationError(name, f"must be >= 1, got {getattr(self, name)}")
        for name in _POSITIVE_SECONDS:
            value = getattr(self, name)
            if type(value) not in (int, float) or not (0 < value < math.inf):
                raise ValidationError(name, f"must be a finite number > 0, got {shown(value)}")
        for name in _SERVER_MILLISECONDS:
            value = getattr(self, name)
            if not (_SERVER_MS_RANGE_S[0] <= value <= _SERVER_MS_RANGE_S[1]):
                raise ValidationError(
                    name,
                    f"must be 0.001 to 2147483 s (sent to PostgreSQL in whole milliseconds"
                    f" below 2^31), got {value!r}",
                )
        if self.pool_size < 1:
            raise ValidationError("pool_size", f"must be >= 1, got {self.pool_size}")
        if self.http_auth_failures < 1:
            raise ValidationError("http_auth_failures", f"must be >= 1, got {self.http_auth_failures}")
        if self.snapshot_interval < 1:
            raise ValidationError("snapshot_interval", "must be >= 1")
        if self.max_conflict_retries < 0:
            raise ValidationError("max_conflict_retries", "must be >= 0")
        if self.checkpoint_every_events < 0 or self.checkpoint_every_s < 0:
            raise ValidationError("checkpoint_every", "must be >= 0 (0: off)")
        if not self.data_key_cache_s >= 0:
            raise ValidationError("data_key_cache_s", "must be >= 0")
        if not self.classify_lock_wait_s > 0:  # NaN too: the wait would never end
            raise ValidationError("classify_lock_wait_s", f"must be > 0, got {self.classify_lock_wait_s!r}")
        if self.read_database_url is not None:
            _require_conninfo("FLOWLEDGER_READ_DATABASE_URL", self.read_database_url)
        if self.event_partitions is not None and not 0 <= self.event_partitions <= MAX_EVENT_PARTITIONS:
            raise ValidationError(
                "event_partitions",
                f"must be 0 (unpartitioned) to {MAX_EVENT_PARTITIONS}, got {self.event_partitions}",
            )

    @property
    def connect_deadline_s(self) -> float:
        """How long one connection attempt may take: ``connect_timeout_s``, cut to the operation
        deadline (no single attempt outlasts the operation it serves)."""
        return min(self.connect_timeout_s, self.operation_deadline_s)

    @property
    def key_dir(self) -> Path:
        """The directory of the audit keys (``audit_key_dir``, else ``home/keys``)."""
        return self.audit_key_dir if self.audit_key_dir is not None else self.home / "keys"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``FLOWLEDGER_*`` variables (``os.environ`` by default)."""
        env = os.environ if environ is None else environ
        refuse_misspelt_variables(env)
        defaults = cls()
        pricing = env.get("FLOWLEDGER_PRICING_FILE")
        catalogue = env.get("FLOWLEDGER_SKILL_CATALOGUE_FILE")
        routing = env.get("FLOWLEDGER_ROUTING_FILE")
        database_url = env.get("FLOWLEDGER_DATABASE_URL") or None
        if database_url is not None and database_url != MEMORY_URL:
            _require_conninfo("FLOWLEDGER_DATABASE_URL", database_url)  # named as the user set it
        return cls(
            database_url=database_url,
            read_database_url=env.get("FLOWLEDGER_READ_DATABASE_URL") or None,
            home=Path(env["FLOWLEDGER_HOME"]) if env.get("FLOWLEDGER_HOME") else defaults.home,
            schema=_named(env, "FLOWLEDGER_SCHEMA", defaults.schema),
            tenant=_named(env, "FLOWLEDGER_TENANT", defaults.tenant),
            llm_base_url=env.get("FLOWLEDGER_LLM_BASE_URL") or None,
            llm_api_key=env.get("FLOWLEDGER_LLM_API_KEY") or None,
            pricing_file=Path(pricing) if pricing else None,
            skill_catalogue_file=Path(catalogue) if catalogue else None,
            routing_file=Path(routing) if routing else None,
            connect_timeout_s=_seconds(env, "FLOWLEDGER_CONNECT_TIMEOUT_S", defaults.connect_timeout_s),
            pool_timeout_s=_seconds(env, "FLOWLEDGER_POOL_TIMEOUT_S", defaults.pool_timeout_s),
            statement_timeout_s=_seconds(env, "FLOWLEDGER_STATEMENT_TIMEOUT_S", defaults.statement_timeout_s),
            operation_deadline_s=_seconds(
                env, "FLOWLEDGER_OPERATION_DEADLINE_S", defaults.operation_deadline_s
            ),
            step_lease_s=_seconds(env, "FLOWLEDGER_STEP_LEASE_S", defaults.step_lease_s),
            classify_lock_wait_s=_seconds(
                env, "FLOWLEDGER_CLASSIFY_LOCK_WAIT_S", defaults.classify_lock_wait_s
            ),
            pgbouncer=_on_or_off(env, "FLOWLEDGER_PGBOUNCER"),
            api_keys=_api_keys(env.get("FLOWLEDGER_API_KEYS") or ""),
            http_max_body_bytes=_count(env, "FLOWLEDGER_HTTP_MAX_BODY_BYTES", defaults.http_max_body_bytes),
            http_rate_per_s=_seconds(env, "FLOWLEDGER_HTTP_RATE_PER_S", defaults.http_rate_per_s),
            http_rate_burst=_count(env, "FLOWLEDGER_HTTP_RATE_BURST", defaults.http_rate_burst),
            http_max_tenant_engines=_count(
                env, "FLOWLEDGER_HTTP_MAX_TENANT_ENGINES", defaults.http_max_tenant_engines
            ),
            http_auth_failures=_count(env, "FLOWLEDGER_HTTP_AUTH_FAILURES", defaults.http_auth_failures),
            http_auth_failure_window_s=_seconds(
                env, "FLOWLEDGER_HTTP_AUTH_FAILURE_WINDOW_S", defaults.http_auth_failure_window_s
            ),
            ready_timeout_s=_seconds(env, "FLOWLEDGER_READY_TIMEOUT_S", defaults.ready_timeout_s),
            dashboard_url_keys=_on_or_off(env, "FLOWLEDGER_DASHBOARD_URL_KEYS"),
            agent_locks=_on_or_off(env, "FLOWLEDGER_AGENT_LOCKS", default=True),
            audit_chain=_on_or_off(env, "FLOWLEDGER_AUDIT_CHAIN", default=True),
            chain_key_replaced=_on_or_off(env, "FLOWLEDGER_CHAIN_KEY_REPLACED"),
            pool_size=_count(env, "FLOWLEDGER_POOL_SIZE", defaults.pool_size),
            write_cache_bytes=_whole(env, "FLOWLEDGER_WRITE_CACHE_BYTES", defaults.write_cache_bytes),
            max_conflict_retries=_whole(
                env, "FLOWLEDGER_MAX_CONFLICT_RETRIES", defaults.max_conflict_retries
            ),
            group_commit=_on_or_off(env, "FLOWLEDGER_GROUP_COMMIT"),
            group_commit_leaders=_count(
                env, "FLOWLEDGER_GROUP_COMMIT_LEADERS", defaults.group_commit_leaders
            ),
            audit_key_dir=Path(env["FLOWLEDGER_AUDIT_KEY_DIR"])
            if env.get("FLOWLEDGER_AUDIT_KEY_DIR")
            else None,
            chain_key=_hex_key(env, "FLOWLEDGER_CHAIN_KEY", MIN_CHAIN_KEY_BYTES),
            signing_key=_hex_key(env, "FLOWLEDGER_SIGNING_KEY", 32, exact=True),
            checkpoint_every_events=_whole(
                env, "FLOWLEDGER_CHECKPOINT_EVERY_EVENTS", defaults.checkpoint_every_events
            ),
            checkpoint_every_s=float(
                _whole(env, "FLOWLEDGER_CHECKPOINT_EVERY_S", int(defaults.checkpoint_every_s))
            ),
            webhook_strict=_on_or_off(env, "FLOWLEDGER_WEBHOOK_STRICT"),
            webhook_allow_private=_on_or_off(env, "FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE"),
            seal_personal_data=_on_or_off(env, "FLOWLEDGER_SEAL_PERSONAL_DATA"),
            data_key_cache_s=_seconds(env, "FLOWLEDGER_DATA_KEY_CACHE_S", defaults.data_key_cache_s),
            event_partitions=_whole(env, "FLOWLEDGER_EVENT_PARTITIONS", -1)
            if (env.get("FLOWLEDGER_EVENT_PARTITIONS") or "").strip()
            else None,
        )

    def with_overrides(self, **overrides: object) -> Settings:
        """A copy with the given non-None fields replaced."""
        given = {name: value for name, value in overrides.items() if value is not None}
        return replace(self, **given)  # type: ignore[arg-type]


_PATHS = ("home", "pricing_file", "skill_catalogue_file", "routing_file", "audit_key_dir")
"""The settings that name files or directories."""
_WHOLE_NUMBERS = (
    "snapshot_interval",
    "max_conflict_retries",
    "pool_size",
    "write_cache_size",
    "write_cache_bytes",
    "http_max_body_bytes",
    "http_rate_burst",
    "http_max_tenant_engines",
    "http_auth_failures",
    "group_commit_leaders",
    "checkpoint_every_events",
)
_COUNTS = ("http_max_body_bytes", "http_rate_burst", "http_max_tenant_engines", "group_commit_leaders")
"""Whole numbers of at least 1 (``pool_size`` and ``http_auth_failures`` are checked on their own)."""
_TEXTS = ("llm_base_url", "llm_api_key")
"""Text or None: a URL of 5 was an AttributeError in ``build_engine``."""
_POSITIVE_SECONDS = (
    "connect_timeout_s",
    "pool_timeout_s",
    "statement_timeout_s",
    "operation_deadline_s",
    "step_lease_s",
    "http_rate_per_s",
    "http_auth_failure_window_s",
    "ready_timeout_s",
)

_SERVER_MILLISECONDS = ("statement_timeout_s", "ready_timeout_s", "operation_deadline_s")
"""Sent to PostgreSQL in whole milliseconds: the first two as ``statement_timeout``, the
operation deadline as every connection's ``tcp_user_timeout``."""
_SERVER_MS_RANGE_S = (0.001, 2_147_483.0)
"""What PostgreSQL takes: past 2^31-1 ms the server refused every connection ("Value exceeds
integer range", exit 1), and libpq every connection's ``tcp_user_timeout`` ("invalid integer
value"), tried again as an outage until that deadline, 34 days for 3000000 s; below 1 ms the
statement timeout sent was 0, which is no timeout at all."""


def _require_conninfo(field_name: str, url: object) -> None:
    """Raise ValidationError unless ``url`` is a libpq connection string (a URL or key=value
    pairs) whose ports are port numbers: libpq finds a port outside 1-65535 only when it
    connects, and that was retried as an outage until the deadline. The messages never quote
    the string (the driver's own may): it may hold a password."""
    try:
        if not isinstance(url, str):
            raise psycopg.ProgrammingError
        params = conninfo_to_dict(url)
    except (psycopg.ProgrammingError, UnicodeEncodeError):  # a lone surrogate: libpq takes UTF-8
        raise ValidationError(
            field_name, "is not a PostgreSQL connection string (postgresql://… or key=value pairs)"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (_WHOLE.fullmatch(port) and 1 <= int(port) <= 65535):
            raise ValidationError(field_name, f"port {port!r} is not a port number (1 to 65535)")


def _named(env: Mapping[str, str], name: str, default: str) -> str:
    """``env[name]`` when set, else ``default``; set but blank is refused."""
    # Where the data goes: `FLOWLEDGER_SCHEMA=$UNSET_VARIABLE` must not write to the default schema.
    raw = env.get(name)
    if raw is None:
        return default
    if not raw.strip():
        raise ValidationError(name, f"must not be empty (unset it for the default, {default!r})")
    return raw


_WHOLE = re.compile(r"[0-9]+")
"""A whole number as the environment gives one: ASCII digits (``str.isdigit`` also took ``²``,
which ``int`` then refused with a bare ValueError, and an Arabic-Indic five, read as 5)."""
_DECIMAL = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?inf(inity)?|nan", re.IGNORECASE)
"""A number as the environment gives one: ASCII digits, a fraction, an exponent (``float`` also
took ``1_0`` and other scripts' digits); ``inf`` and ``nan`` are read to be refused by name."""


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds from ``env[name]``, else ``default``."""
    raw = env.get(name)
    if not raw:
        return default
    if not _DECIMAL.fullmatch(raw.strip()):
        raise ValidationError(name, f"{raw!r} is not a number of seconds")
    value = float(raw)
    if not value > 0:
        raise ValidationError(name, f"must be > 0, got {raw!r}")
    if math.isinf(value):  # "inf" parses: a wait or deadline without end
        raise ValidationError(name, f"must be a finite number of seconds, got {raw!r}")
    return value


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive whole number from ``env[name]``, else ``default``."""
    raw = env.get(name)
    if not raw:
        return default
    if not _WHOLE.fullmatch(raw.strip()) or int(raw) < 1:
        raise ValidationError(name, f"{raw!r} is not a positive whole number")
    return int(raw)


def _api_keys(raw: str) -> tuple[tuple[str, str, str], ...]:
    """``tenant:role:secret,...`` as triples (the secret may itself contain ``:``).

    The tenant is percent-decoded, so that every tenant name can be spelt here (``keys
    create`` takes any): ``%3A`` is ``:``, ``%2C`` is ``,`` and ``%25`` is ``%``. A ``%``
    followed by anything but two hex digits stays as written."""
    keys = []
    for item in raw.split(","):
        if not item.strip():
            continue
        parts = item.strip().split(":", 2)
        if len(parts) != 3 or not all(parts):
            raise ValidationError(
                "FLOWLEDGER_API_KEYS",
                "each key is tenant:role:secret, comma-separated (a tenant's ':' is %3A, ',' is %2C)",
            )
        keys.append((_tenant(parts[0]), parts[1], parts[2]))
    _require_usable_secrets("FLOWLEDGER_API_KEYS", keys)
    return tuple(keys)


MIN_CHAIN_KEY_BYTES = 16
"""The shortest chain key (``FLOWLEDGER_CHAIN_KEY``, ``Settings.chain_key``, ``AuditTrail.use_chain_key``)."""
MIN_SECRET_LENGTH = 16
"""The shortest secret a key given in the environment may have: ``x`` was taken, and the
limit on refused keys (``FLOWLEDGER_HTTP_AUTH_FAILURES``) slows guessing, it does not make a
short secret safe. ``flowledger keys create`` makes 43-character ones."""


def _key_triples(field_name: str, keys: object) -> tuple[tuple[str, str, str], ...]:
    """``keys`` (a list or tuple of (tenant, role, secret) texts) as a tuple of triples, else a
    ValidationError naming ``field_name`` (5 was a TypeError, a pair a ValueError)."""
    shape = "must be a list of (tenant, role, secret) texts"
    if not isinstance(keys, list | tuple):
        raise ValidationError(field_name, f"{shape}, got {shown(keys)}")
    triples = []
    for number, key in enumerate(keys, start=1):
        if not (
            isinstance(key, list | tuple) and len(key) == 3 and all(isinstance(p, str) and p for p in key)
        ):
            # The key itself is not quoted: it may hold a secret.
            raise ValidationError(field_name, f"{shape}: key {number} is not one")
        triples.append((key[0], key[1], key[2]))
    return tuple(triples)


def _require_keys(settings: Settings) -> None:
    """The audit keys and the LLM texts as their variables are read: the chain key bytes of at
    least 16 (``chain_key="…"`` failed every start with a bare TypeError; ``b""`` sealed the log
    under an empty HMAC key), the signing key exactly 32 bytes, the URL and API key text."""
    for name, size, exact in (("chain_key", MIN_CHAIN_KEY_BYTES, False), ("signing_key", 32, True)):
        key = getattr(settings, name)
        if key is not None and (type(key) is not bytes or len(key) < size or (exact and len(key) != size)):
            raise ValidationError(
                name, f"must be {'exactly' if exact else 'at least'} {size} bytes (bytes.fromhex of its hex)"
            )
    for name in _TEXTS:
        value = getattr(settings, name)
        if value is not None and not isinstance(value, str):
            raise ValidationError(name, f"must be text, got {type(value).__name__}")


def _require_usable_secrets(field_name: str, keys: Iterable[tuple[str, str, str]]) -> None:
    """Refuse a secret shorter than ``MIN_SECRET_LENGTH``, one that begins or ends with white
    space (a request's key never holds the spaces around it: such a key could never be used),
    or one given to two keys (which grant acts would be a guess: a secret listed as a reader's
    and an admin's acted as the admin, the last one listed). The message numbers the keys and
    never quotes a secret."""
    first: dict[str, int] = {}
    for number, (_, _, secret) in enumerate(keys, start=1):
        if secret != secret.strip():
            raise ValidationError(
                field_name,
                f"the secret of key {number} begins or ends with white space, which no request can"
                " carry (HTTP drops it): remove it",
            )
        if len(secret) < MIN_SECRET_LENGTH:
            raise ValidationError(
                field_name,
                f"the secret of key {number} has {len(secret)} characters; give at least"
                f" {MIN_SECRET_LENGTH}: a random one, such as `flowledger keys create` makes",
            )
        if secret in first:
            raise ValidationError(
                field_name,
                f"keys {first[secret]} and {number} have the same secret: give each key its own",
            )
        first[secret] = number


def _tenant(written: str) -> str:
    """A key's tenant as ``FLOWLEDGER_API_KEYS`` spells it, percent-decoded (``_api_keys``)."""
    if "%" not in written:
        return written
    try:
        return unquote(written, errors="strict")
    except UnicodeDecodeError:
        raise ValidationError(
            "FLOWLEDGER_API_KEYS", f"the tenant {written!r} is not UTF-8 once percent-decoded"
        ) from None


_OFF = {"0", "false", "no", "off", "n"}
_ON = {"1", "true", "yes", "on", "y"}


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number >= 0 from ``env[name]`` (0: off), else ``default``."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not _WHOLE.fullmatch(raw):
        raise ValidationError(name, f"{raw!r} is not a whole number (0: off)")
    return int(raw)


def _hex_key(env: Mapping[str, str], name: str, size: int, *, exact: bool = False) -> bytes | None:
    """A key given as hex in ``env[name]`` (at least, or ``exact``ly, ``size`` bytes), else None."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        raise ValidationError(name, "is not hexadecimal") from None
    if len(key) < size or (exact and len(key) != size):
        raise ValidationError(
            name, f"must be {'exactly' if exact else 'at least'} {size} bytes ({2 * size} hex digits)"
        )
    return key


def _on_or_off(env: Mapping[str, str], name: str, *, default: bool = False) -> bool:
    """A switch: an on word, an off word, unset (or empty) for ``default``; anything else is
    refused. Loose readings hid typos: an opt-in took any other word for off, a switch on by
    default any other word for on, and a typo of "true" once turned group commit on."""
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in _OFF:
        return False
    if raw in _ON:
        return True
    raise ValidationError(name, f"must be on or off (1/true/yes/on, 0/false/no/off), got {env[name]!r}")


_FLAGS = tuple(f.name for f in fields(Settings) if f.type in ("bool", bool))
"""The fields that are True or False, checked as given (``Settings.__post_init__``)."""
