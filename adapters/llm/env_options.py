"""The client's settings a server takes from its environment (``flowledger serve`` has no
other way to set them): timeouts, retries, the breaker, streaming, unpriced models, the
reply size limit and one rate limit for every model.

- ``FLOWLEDGER_LLM_DEFAULT_MODEL``: ``default_model``;
- ``FLOWLEDGER_LLM_CONNECT_TIMEOUT_S``, ``FLOWLEDGER_LLM_REQUEST_TIMEOUT_S``,
  ``FLOWLEDGER_LLM_READ_TIMEOUT_S``: the timeouts;
- ``FLOWLEDGER_LLM_MAX_RETRIES``, ``FLOWLEDGER_LLM_MAX_TOKENS``,
  ``FLOWLEDGER_LLM_MAX_REPLY_BYTES`` (``max_reply_bytes``);
- ``FLOWLEDGER_LLM_STREAM``: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``;
- ``FLOWLEDGER_LLM_UNPRICED_MODELS``: ``refuse`` or ``flag``;
- ``FLOWLEDGER_LLM_BREAKER_THRESHOLD``, ``FLOWLEDGER_LLM_BREAKER_RECOVERY_S``: the breaker;
- ``FLOWLEDGER_LLM_RPM`` with ``FLOWLEDGER_LLM_TPM``: ``default_limits``, per minute;
- ``FLOWLEDGER_LLM_TRANSPORT``: ``aiohttp`` (the default) or ``httpx`` (``transport``);
- ``FLOWLEDGER_LLM_KEEPALIVE_S``: ``keepalive_expiry_s``.

A value that does not read is a ValidationError naming the variable; the config's own
checks (``ClientConfig``) apply to what is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flowledger.adapters.llm.config import TRANSPORTS, ModelLimits
from flowledger.domain.errors import ValidationError

_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "FLOWLEDGER_LLM_DEFAULT_MODEL": ("default_model", str),
    "FLOWLEDGER_LLM_CONNECT_TIMEOUT_S": ("connect_timeout_s", float),
    "FLOWLEDGER_LLM_REQUEST_TIMEOUT_S": ("request_timeout_s", float),
    "FLOWLEDGER_LLM_READ_TIMEOUT_S": ("read_timeout_s", float),
    "FLOWLEDGER_LLM_MAX_RETRIES": ("max_retries", int),
    "FLOWLEDGER_LLM_MAX_TOKENS": ("max_tokens", int),
    "FLOWLEDGER_LLM_MAX_REPLY_BYTES": ("max_reply_bytes", int),
    "FLOWLEDGER_LLM_UNPRICED_MODELS": ("unpriced_models", str),
    "FLOWLEDGER_LLM_BREAKER_THRESHOLD": ("breaker_failure_threshold", int),
    "FLOWLEDGER_LLM_BREAKER_RECOVERY_S": ("breaker_recovery_s", float),
    "FLOWLEDGER_LLM_KEEPALIVE_S": ("keepalive_expiry_s", float),
}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_KINDS: dict[Callable[[str], Any], str] = {str: "text", int: "a whole number", float: "a number"}


def client_options_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The ClientConfig fields ``env`` sets (see the module); none when it sets none."""
    options: dict[str, Any] = {}
    for variable, (field, read) in _FIELDS.items():
        raw = env.get(variable)
        if raw:
            try:
                options[field] = read(raw.strip())
            except ValueError:
                raise ValidationError(variable, f"must be {_KINDS[read]}, got {raw!r}") from None
    stream = env.get("FLOWLEDGER_LLM_STREAM")
    if stream:
        if stream.strip().lower() not in _TRUE | _FALSE:
            raise ValidationError("FLOWLEDGER_LLM_STREAM", f"must be true or false, got {stream!r}")
        options["stream"] = stream.strip().lower() in _TRUE
    transport = env.get("FLOWLEDGER_LLM_TRANSPORT")
    if transport:
        if transport.strip().lower() not in TRANSPORTS:
            raise ValidationError(
                "FLOWLEDGER_LLM_TRANSPORT", f"must be one of {', '.join(TRANSPORTS)}, got {transport!r}"
            )
        options["transport"] = transport.strip().lower()
    rpm, tpm = env.get("FLOWLEDGER_LLM_RPM"), env.get("FLOWLEDGER_LLM_TPM")
    if rpm or tpm:
        if not (rpm and tpm):
            raise ValidationError(
                "FLOWLEDGER_LLM_RPM", "FLOWLEDGER_LLM_RPM and FLOWLEDGER_LLM_TPM go together"
            )
        try:
            per_minute = int(rpm), int(tpm)
        except ValueError:
            raise ValidationError(
                "FLOWLEDGER_LLM_RPM", f"rpm and tpm must be whole numbers, got {rpm!r}/{tpm!r}"
            ) from None
        # ModelLimits' own refusal (a count below 1) is a ValidationError, itself a ValueError:
        # read apart from the conversion, or it was reported as "must be whole numbers".
        if min(per_minute) < 1:
            raise ValidationError("FLOWLEDGER_LLM_RPM", f"rpm and tpm must be >= 1, got {rpm!r}/{tpm!r}")
        options["default_limits"] = ModelLimits(rpm=per_minute[0], tpm=per_minute[1])
    return options
