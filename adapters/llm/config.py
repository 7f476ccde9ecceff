"""The LLM client's options, validated when constructed (keyword-only, immutable)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal
from urllib.parse import urlsplit

from flowledger.domain.bounds import require_model, require_name
from flowledger.domain.errors import ValidationError

# Printable ASCII without spaces: what every provider's keys look like, and what an
# HTTP header can carry. A pasted key with a newline or quotes is caught at start-up (whole:
# ``fullmatch``, as "$" matched before a trailing newline, a key read from a file with its own).
_KEY_SHAPE = re.compile(r"[\x21-\x7e]{8,512}")

MAX_SECONDS = 86_400.0
"""The longest timeout or breaker recovery taken: a day (the OpenAI SDK's default timeout is 600 s)."""

DEFAULT_REPLY_BYTES = 32 * 1024 * 1024
"""``ClientConfig.max_reply_bytes`` unless set: a completion's JSON is a few KiB. Here, not in
``reply_limit`` (which imports aiohttp), so the command line loads no HTTP client."""
MIN_REPLY_BYTES = 1024
MAX_REPLY_BYTES = 1024**3
"""The range ``max_reply_bytes`` takes: a completion's JSON is a few KiB; a GiB is past any reply."""
MAX_COMPLETION_TOKENS = 128_000
"""The largest ``max_tokens`` taken: the largest completion an OpenAI chat model returns (the
simulator refuses more, as OpenAI does); past it every call would be refused by the endpoint."""

Transport = Literal["aiohttp", "httpx"]
TRANSPORTS: tuple[Transport, ...] = ("aiohttp", "httpx")
"""The clients a request can go through, under httpx's API (``transport.build_transport``)."""


class ApiKey:
    """An API key that never shows itself in a repr, a log line or an event."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not _KEY_SHAPE.fullmatch(value):
            raise ValidationError(
                "llm_api_key", "must be 8-512 printable characters without spaces or quotes"
            )
        if value[0] in "'\"" or value[-1] in "'\"":
            raise ValidationError("llm_api_key", "looks quoted; remove the quotes")
        self._value = value

    def reveal(self) -> str:
        """The key itself, for the Authorization header only."""
        return self._value

    def __repr__(self) -> str:
        return "ApiKey('***')"

    __str__ = __repr__


def shown_endpoint(url: str) -> str:
    """``url`` as a message, a log line or an event may quote it: scheme, host and path, with
    credentials (``user:password@``) as ``***@`` and a query or fragment as ``?***`` / ``#***``.

    Plain string cuts, not ``urlsplit``: the URLs quoted most are those refused for not
    parsing (``http://user:secret@[::1/v1``), and they must not be quoted whole either.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    cut = min((at for at in (rest.find("?"), rest.find("#")) if at >= 0), default=len(rest))
    rest, tail = rest[:cut], rest[cut:]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{separator}{authority}{slash}{path}" + (f"{tail[0]}***" if tail else "")


COMPLETIONS_PATH = "/chat/completions"
"""What the client adds to the base URL for a completion (as the OpenAI SDK does)."""


def require_endpoint_url(base_url: str) -> None:
    """Refuse (ValidationError on ``llm_base_url``) a base URL the client cannot request as given.

    Each of these was taken and failed every call: a port past 65535 or credentials in the URL
    (a bare ValueError from the HTTP client, recorded as a failed step), a query or a fragment
    (the path ``/chat/completions`` went after it: a 404), a URL that does not parse, one that
    already ends in ``/chat/completions`` (the path twice: a 404 on every step). The key
    goes in ``FLOWLEDGER_LLM_API_KEY``; the URL is quoted as ``shown_endpoint`` gives it (a
    refusal quoted it whole: password and ``?api-key=`` into the CLI's line and the log).
    """
    shown = repr(shown_endpoint(base_url))
    if any(char.isspace() or not char.isprintable() for char in base_url):
        raise ValidationError("llm_base_url", f"holds a space or a control character: {shown}")
    try:
        parts = urlsplit(base_url)
        port = parts.port
    except ValueError as error:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        problem = "port must be 1-65535" if "Port" in str(error) else f"not a URL ({error})"
        raise ValidationError("llm_base_url", f"{problem}: {shown}") from None
    if parts.username is not None or parts.password is not None:
        raise ValidationError(
            "llm_base_url", "holds credentials (user:password@); give the key in FLOWLEDGER_LLM_API_KEY"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("llm_base_url", f"must be an http(s) URL with a host, got {shown}")
    if port == 0:
        raise ValidationError("llm_base_url", f"port must be 1-65535: {shown}")
    for part, text in (("query", parts.query), ("fragment", parts.fragment)):
        if text or base_url.endswith("?" if part == "query" else "#"):
            raise ValidationError(
                "llm_base_url",
                f"must not hold a {part} (the path /chat/completions is added to it): {shown}",
            )
    if base_url.rstrip("/").endswith(COMPLETIONS_PATH):
        # Taken, every step was a 422 "HTTP 404 ... no route POST .../chat/completions/chat/
        # completions", told to its caller as a request the endpoint refused.
        base = shown_endpoint(base_url.rstrip("/").removesuffix(COMPLETIONS_PATH))
        raise ValidationError(
            "llm_base_url",
            f"ends in {COMPLETIONS_PATH}, which the client adds to it: give {base!r}, not {shown}",
        )


@dataclass(frozen=True, kw_only=True)
class ModelLimits:
    """Requests and tokens a model may take per ``period_s`` (a minute by default)."""

    rpm: int
    tpm: int
    period_s: float = 60.0

    def __post_init__(self) -> None:
        # Counts and a finite period, checked here: NaN failed every call with aiolimiter's bare
        # ValueError, "5" a TypeError at this comparison, 1.5 and True were taken as counts, and
        # an infinite period let no request through.
        if any(type(count) is not int or count < 1 for count in (self.rpm, self.tpm)):
            raise ValidationError(
                "limits", f"rpm and tpm must be whole numbers >= 1, got {self.rpm!r}/{self.tpm!r}"
            )
        period = self.period_s
        if isinstance(period, bool) or not isinstance(period, int | float) or not 0 < period <= MAX_SECONDS:
            raise ValidationError(
                "limits.period_s", f"must be a number of seconds > 0 and at most a day, got {period!r}"
            )


DEFAULT_KEEPALIVE_EXPIRY_S = 4.0
"""How long an idle connection is kept for the next call: under the 5 s after which uvicorn
(vLLM, the LiteLLM proxy, most Python servers) and Node close an idle connection. At httpx's
5 s (aiohttp's 15 s) the server closed connections as the client reused them: against a
uvicorn endpoint, calls 5 s apart failed their first attempt on 3-6 % of calls
(``connection_error``, retried), and each such call was recorded ``unpriced``, as a request
the provider may have had."""

DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""How long connecting may take when ``connect_timeout_s`` is not given (and the request's
deadline is no shorter)."""


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Everything the OpenAI-compatible client is configured with.

    ``request_timeout_s`` bounds one attempt end to end (connect, send, wait, read);
    ``connect_timeout_s`` bounds the TCP/TLS connect alone (None, the default: 5 s, or
    ``request_timeout_s`` when that is shorter; a request timeout of 1 s alone was refused as
    "connect_timeout_s: cannot exceed request_timeout_s", a timeout nobody had set);
    ``read_timeout_s`` the longest a stream may go without a byte, its first included (a
    stalled stream ends then, and is retried, instead of at the attempt's deadline), ``None``
    for ``request_timeout_s``; a reply
    that is not streamed sends nothing until it is whole, so only ``request_timeout_s`` bounds it.
    ``max_retries`` follows the OpenAI SDK's meaning: retries after the first attempt. ``transport`` picks the
    client under httpx's API: ``"aiohttp"`` (the default, ``httpx-aiohttp``) or ``"httpx"``
    (httpx's own pool, split into pools of ``pool_shard_size`` connections); see ``transport``.
    ``unpriced_models`` says what a call to a model without a price does: ``"refuse"`` (raise
    UnknownModelPrice before anything is sent) or ``"flag"`` (call it; its usage says
    ``unpriced`` and ``prices reprice`` can price it once a price is added).
    ``max_reply_bytes`` bounds what is read of one reply, streamed or not (``reply_limit``).
    ``keepalive_expiry_s`` (4 s) is how long an idle connection is kept: shorter than the
    endpoint's own idle timeout, or a call reuses a connection as the server closes it.
    """

    base_url: str
    api_key: ApiKey
    default_model: str = "deepseek-v3.2"
    provider: str = "openai_compatible"
    connect_timeout_s: float | None = None
    request_timeout_s: float = 60.0
    read_timeout_s: float | None = None
    max_connections: int = 200
    max_keepalive_connections: int = 100
    keepalive_expiry_s: float = DEFAULT_KEEPALIVE_EXPIRY_S
    pool_shard_size: int = 8
    transport: Transport = "aiohttp"
    max_retries: int = 2
    max_tokens: int = 1024
    temperature: float = 0.3
    stream: bool = False
    limits: Mapping[str, ModelLimits] = field(default_factory=dict)
    default_limits: ModelLimits | None = None
    breaker_failure_threshold: int = 5
    breaker_recovery_s: float = 30.0
    unpriced_models: str = "refuse"
    max_reply_bytes: int = DEFAULT_REPLY_BYTES

    def __post_init__(self) -> None:
        _require_types(self)
        require_endpoint_url(self.base_url)
        if not isinstance(self.api_key, ApiKey):
            raise ValidationError("llm_api_key", "must be an ApiKey")
        if not self.default_model.strip():
            raise ValidationError("default_model", "must be a non-empty string")
        # Both are checked per call otherwise, or not at all: a default model " m" was asked for
        # with its space, one holding a control character refused every call as a "model" the
        # caller never gave, and a provider of 300 characters (it is every call's
        # usage.provider, a name) made every call paid for and then unrecordable.
        named = partial(require_name, "provider")
        for name, check in (("default_model", require_model), ("provider", named)):
            try:
                check(getattr(self, name))
            except ValidationError as error:
                raise ValidationError(name, error.message) from None
        if self.connect_timeout_s is None:
            # A number that is no timeout stays what it is, for the check below to name.
            shorter = (
                self.request_timeout_s if 0 < self.request_timeout_s < DEFAULT_CONNECT_TIMEOUT_S else None
            )
            object.__setattr__(self, "connect_timeout_s", shorter or DEFAULT_CONNECT_TIMEOUT_S)
        for name in ("connect_timeout_s", "request_timeout_s", "breaker_recovery_s", "keepalive_expiry_s"):
            # inf was taken, and every call then failed (OverflowError in the event loop's timer);
            # 1e300 was taken too, and an open breaker asked callers to wait that long.
            if not 0 < getattr(self, name) <= MAX_SECONDS:
                raise ValidationError(
                    name, f"must be a number of seconds > 0 and at most {MAX_SECONDS:,.0f} (a day)"
                )
        if self.connect_timeout_s > self.request_timeout_s:  # type: ignore[operator]
            raise ValidationError(
                "connect_timeout_s",
                f"cannot exceed request_timeout_s: "
                f"{self.connect_timeout_s:g} s > {self.request_timeout_s:g} s",
            )
        if self.read_timeout_s is not None and not 0 < self.read_timeout_s <= self.request_timeout_s:
            raise ValidationError("read_timeout_s", "must be > 0 and cannot exceed request_timeout_s")
        if self.max_connections < 1 or not 0 <= self.max_keepalive_connections <= self.max_connections:
            raise ValidationError("max_connections", "need 1 <= keepalive <= max_connections")
        if self.transport not in TRANSPORTS:
            raise ValidationError(
                "transport", f"must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}"
            )
        for name in ("max_connections", "max_keepalive_connections", "pool_shard_size", "max_retries"):
            if type(getattr(self, name)) is not int:  # True was 1 retry, 2.5 a shard size
                raise ValidationError(name, f"must be a whole number, got {getattr(self, name)!r}")
        if self.pool_shard_size < 1:
            raise ValidationError("pool_shard_size", "must be >= 1")
        if not 0 <= self.max_retries <= 10:
            raise ValidationError("max_retries", "must be between 0 and 10")
        if not isinstance(self.stream, bool):  # "no" is true: every reply was streamed
            raise ValidationError("stream", f"must be True or False, got {self.stream!r}")
        _require_limits(self.limits, self.default_limits)
        max_tokens = self.max_tokens
        if (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, int)
            or not 1 <= max_tokens <= MAX_COMPLETION_TOKENS
        ):
            allowed = f"must be a whole number from 1 to {MAX_COMPLETION_TOKENS:,}"
            raise ValidationError("max_tokens", f"{allowed}, got {max_tokens!r}")
        # NaN and inf failed every call as a bare ValueError (the body cannot be JSON); outside
        # 0 to 2, OpenAI refuses every call with a 400.
        temperature = self.temperature
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature <= 2
        ):
            raise ValidationError("temperature", f"must be a number from 0 to 2, got {temperature!r}")
        if not MIN_REPLY_BYTES <= self.max_reply_bytes <= MAX_REPLY_BYTES:
            raise ValidationError(
                "max_reply_bytes", f"must be from {MIN_REPLY_BYTES:,} to {MAX_REPLY_BYTES:,} bytes"
            )
        threshold = self.breaker_failure_threshold
        if type(threshold) is not int or threshold < 1:
            raise ValidationError(
                "breaker_failure_threshold", f"must be a whole number >= 1, got {threshold!r}"
            )
        if self.unpriced_models not in ("refuse", "flag"):
            raise ValidationError(
                "unpriced_models", f"must be 'refuse' or 'flag', got {self.unpriced_models!r}"
            )

    @property
    def endpoint(self) -> str:
        """The chat-completions URL, which is also the circuit breaker's key."""
        return self.base_url.rstrip("/") + COMPLETIONS_PATH


def _require_limits(limits: object, default: object) -> None:
    """Rate limits as the limiter reads them: model names to ``ModelLimits``, a default that is
    one or None (each was taken, and every call failed with a bare AttributeError)."""
    if not isinstance(limits, Mapping):
        raise ValidationError("limits", f"must map model names to ModelLimits, got {type(limits).__name__}")
    for model, limit in limits.items():
        if not isinstance(model, str) or not isinstance(limit, ModelLimits):
            raise ValidationError(
                "limits", f"must map model names to ModelLimits, got {model!r}: {type(limit).__name__}"
            )
    if default is not None and not isinstance(default, ModelLimits):
        raise ValidationError(
            "default_limits", f"must be a ModelLimits or None, got {type(default).__name__}"
        )


_SECONDS = (
    "connect_timeout_s",
    "request_timeout_s",
    "read_timeout_s",
    "breaker_recovery_s",
    "keepalive_expiry_s",
)
"""ClientConfig's durations (``connect_timeout_s`` and ``read_timeout_s`` may be None)."""


def _require_types(config: ClientConfig) -> None:
    """The kinds of ``config``'s values, before their ranges are checked: text that is no text was
    an AttributeError (a base URL or default model of 5), a timeout given as text a TypeError
    at its comparison; True was taken as a second, 2048.5 as a number of bytes."""
    if not isinstance(config.base_url, str):
        raise ValidationError("llm_base_url", f"must be an http(s) URL, got {type(config.base_url).__name__}")
    if not isinstance(config.default_model, str):
        raise ValidationError(
            "default_model", f"must be a model's name, got {type(config.default_model).__name__}"
        )
    for name in _SECONDS:
        value = getattr(config, name)
        if value is None and name in ("connect_timeout_s", "read_timeout_s"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(name, f"must be a number of seconds, got {value!r}")
    if type(config.max_reply_bytes) is not int:
        raise ValidationError(
            "max_reply_bytes", f"must be a whole number of bytes, got {config.max_reply_bytes!r}"
        )
