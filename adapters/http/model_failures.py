"""A failed model call as its caller is told it: without the model endpoint's URL, host name or
address (where this server sends its model traffic is its operator's business, not its callers'),
the whole failure logged under the request's id."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import urlsplit

from flowledger.domain import errors

error_log = logging.getLogger("flowledger.http.errors")
"""The middleware's error log (``middleware.log_requests`` sends it to stderr as JSON lines)."""

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()]+")
_AT_URL = re.compile(r" at [a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()]+?(?=: |\s|$)")
_ADDRESS_TUPLE = re.compile(r"\('[^']*', \d{1,5}(?:, \d+, \d+)?\)")
"""A socket address as Python's errors quote it: ``('10.0.0.5', 8443)``, ``('::1', 8443, 0, 0)``."""
_HOST = re.compile(r"\bhost\s+[^\s,;'\"]+", re.IGNORECASE)
_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\w.])")
_TRAILING = ".,:;"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_NAME_PORT = re.compile(rf"(?<![\w.\-/@:\[])({_LABEL}(?:\.{_LABEL})*):\d{{2,5}}(?![\w:-]|\.\w)")
"""A host with its port and no scheme (``llm-gw:8080``, ``gateway.local:443``): kept when the
name has no letter (a time of day) or neither a dot nor a hyphen (``limit:1000``)."""
_DOTTED = re.compile(r"(?<![\w.\-/@])(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,63}(?![\w-]|\.\w)")
"""A lower-case dotted name (``llm-gw.corp.local``): a host when it ends in a suffix hosts end in
(``HOST_SUFFIXES``), or has three labels or more, the last a country's or one with a hyphen or
digit; not a file name (``FILE_SUFFIXES``) nor a field's path (``messages.0.content``,
``input.messages.content``). A model's
name has digits in its last label (``claude-3.5-sonnet``), Python's errors a capital
(``httpx.ConnectError``)."""
_NAMED_AFTER = re.compile(
    r"((?:Name or service not known:|getaddrinfo failed for|Cannot connect to host|connect to)\s+)"
    r"(?!(?:the|a|an|any|host)\b)[A-Za-z0-9_](?:[\w.-]*\w)?(?::\d{1,5})?",
    re.IGNORECASE,
)
"""The word after what names a host in a resolver's or a connection's error (``Name or service
not known: llm-gw``, ``getaddrinfo failed for gateway``, ``connect to llmproxy``): withheld
even without a dot or a port, which the other shapes need (a compose service's one-word name
passed whole); an article there is the sentence's, and ``host`` is ``_HOST``'s to withhold."""
_BRACKETED_IPV6 = re.compile(r"\[[0-9A-Fa-f]*:[0-9A-Fa-f:.]*\](?::\d{1,5})?")
HOST_SUFFIXES = frozenset(
    {
        "com",
        "net",
        "org",
        "io",
        "ai",
        "dev",
        "app",
        "cloud",
        "local",
        "localdomain",
        "internal",
        "intranet",
        "corp",
        "lan",
        "home",
        "svc",
        "cluster",
        "private",
    }
)
FILE_SUFFIXES = frozenset(
    {
        "py",
        "json",
        "jsonl",
        "txt",
        "md",
        "html",
        "yaml",
        "yml",
        "toml",
        "cfg",
        "ini",
        "log",
        "csv",
        "js",
        "ts",
        "pem",
        "crt",
        "key",
        "sock",
    }
)

URL_WITHHELD = "[URL withheld]"
HOST_WITHHELD = "[host withheld]"
ADDRESS_WITHHELD = "[address withheld]"


def withheld(message: str) -> str:
    """``message`` without URLs, host names and IPv4 addresses: the endpoint the call was made
    at (``gpt-4.1 at http://…: HTTP 503 …``), a redirect's target, the host a connection error
    names (aiohttp's ``Cannot connect to host llm.corp:8443 … ('10.0.0.5', 8443)``), a host
    named without a scheme (``Name or service not known: llm-gw.corp.local``, ``llm-gw:8080``),
    a one-word host after what names one (``getaddrinfo failed for gateway``), IPv4 addresses
    anywhere and IPv6 ones in a URL, a socket address or brackets."""
    hosts = {urlsplit(found.rstrip(_TRAILING)).hostname for found in _URL.findall(message)}
    text = _AT_URL.sub("", message)
    text = _URL.sub(lambda found: URL_WITHHELD + _trailing(found[0]), text)
    text = _ADDRESS_TUPLE.sub(ADDRESS_WITHHELD, text)
    text = _BRACKETED_IPV6.sub(ADDRESS_WITHHELD, text)
    text = _HOST.sub(f"host {HOST_WITHHELD}", text)
    text = _IPV4.sub(ADDRESS_WITHHELD, text)
    text = _NAME_PORT.sub(_bare_host, text)
    text = _DOTTED.sub(_dotted_host, text)
    text = _NAMED_AFTER.sub(rf"\g<1>{HOST_WITHHELD}", text)
    for host in sorted((h for h in hosts if h), key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", HOST_WITHHELD, text, flags=re.IGNORECASE)
    return text


def _bare_host(found: re.Match[str]) -> str:
    """``found`` (a name and a port) withheld when the name is a host's (``_NAME_PORT``)."""
    name = found[1]
    is_host = any(c.isalpha() for c in name) and ("." in name or "-" in name or name.lower() == "localhost")
    return HOST_WITHHELD if is_host else found[0]


def _dotted_host(found: re.Match[str]) -> str:
    """``found`` (a dotted name) withheld when it is a host's (``_DOTTED``)."""
    labels = found[0].split(".")
    # A field's path (``messages.0.content``: pydantic's and Anthropic's errors name fields so)
    # has an index after its first name; a host has no label of digits but perhaps its first.
    if labels[-1] in FILE_SUFFIXES or any(label.isdigit() for label in labels[1:]):
        return found[0]
    if labels[-1] in HOST_SUFFIXES:
        return HOST_WITHHELD
    # Three labels or more: a host when its last is a country's (``acme.de``) or a label has a
    # hyphen or a digit (``llm-gw.acme.tech``); ``input.messages.content`` is a field's path.
    named = len(labels) >= 3 and (len(labels[-1]) == 2 or any(not label.isalpha() for label in labels))
    return HOST_WITHHELD if named else found[0]


def _trailing(url: str) -> str:
    """The punctuation a URL match took from the sentence around it (``…/completions:``)."""
    return url[len(url.rstrip(_TRAILING)) :]


def told_of(error: errors.LlmError, request_id: str | None) -> str:
    """What the caller of a failed model call is told: the failure with the endpoint withheld,
    and the request id under which the log has it whole (logged here). The reply named the
    endpoint's internal URL: ``gpt-4.1 at http://llm-gateway.corp.internal:8443/v1/chat/completions:
    HTTP 503 …``, and a connection error its host and address."""
    message = str(error)
    said = withheld(message)
    if said == message:
        return message
    error_log.error("model call failed in request %s (%s): %s", request_id or "-", error.error_type, message)
    under = f"request id {request_id}" if request_id else "this request"
    return f"model call failed: {said} (the server's log has the whole failure under {under})"


FAILURE_EVENTS = frozenset({"Session.StepFailed", "Task.ClassificationFailed"})
"""The events that record a failed model call, by the type REST's histories name them with."""
_FAILURE_FIELDS = ("error_message", "error_detail", "detail")
"""Their fields that may name the endpoint: the message, and the error's fields (a
``CircuitOpen``'s ``endpoint``)."""


def shown_event_data(event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event's data as REST's histories show it: a failed model call's message and fields
    withheld as a failure's reply is (``withheld``), every other event's as recorded. The
    history showed a ``StepFailed`` whole (``gpt-4.1 at http://llm-gateway.corp.internal:8443/…``)
    where the failure's reply and the session's ``failures`` withheld it."""
    if event_type not in FAILURE_EVENTS:
        return data
    return {name: _withheld_in(value) if name in _FAILURE_FIELDS else value for name, value in data.items()}


def _withheld_in(value: Any) -> Any:
    """``value`` with ``withheld`` applied to every text in it (in objects and lists too)."""
    if isinstance(value, str):
        return withheld(value)
    if isinstance(value, dict):
        return {name: _withheld_in(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_withheld_in(item) for item in value]
    return value
