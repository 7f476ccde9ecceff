"""Settings given as arguments are held to the rules their ``FLOWLEDGER_…`` variables are read
by: a key of the wrong kind or length, a count of 0, text that is no text, an API key that is no
(tenant, role, secret) triple is a ValidationError naming the setting, at construction.

Observed (an outside probe): ``Settings(chain_key="abc")`` was taken and every engine start then
failed with a bare ``TypeError`` ("The fill character must be a unicode character, not bytes");
``chain_key=b""`` sealed the log with an empty HMAC key, where ``FLOWLEDGER_CHAIN_KEY`` takes 16
bytes at least; ``http_rate_burst=0`` answered every keyed request 429 for ever and
``http_max_body_bytes=0`` every body 413, where their variables refuse 0; ``llm_base_url=5``
raised ``AttributeError`` from ``build_engine``; ``api_keys=5`` a ``TypeError``.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Settings

REFUSED: list[tuple[str, Any]] = [
    ("chain_key", "ab" * 16),
    ("chain_key", b""),
    ("chain_key", b"k" * 15),
    ("chain_key", 5),
    ("chain_key", bytearray(b"k" * 32)),
    ("signing_key", "ab" * 32),
    ("signing_key", b""),
    ("signing_key", b"k" * 31),
    ("signing_key", b"k" * 33),
    ("llm_base_url", 5),
    ("llm_base_url", b"http://x/v1"),
    ("llm_api_key", 5),
    ("llm_api_key", b"sk-123456789"),
    ("http_max_body_bytes", 0),
    ("http_max_body_bytes", -1),
    ("http_rate_burst", 0),
    ("http_rate_burst", -5),
    ("http_max_tenant_engines", 0),
    ("http_max_tenant_engines", -1),
    ("group_commit_leaders", 0),
    ("group_commit_leaders", -1),
    ("api_keys", 5),
    ("api_keys", "acme:admin:0123456789abcdef0123"),
    ("api_keys", (("acme", "admin"),)),
    ("api_keys", (("acme", "admin", 5),)),
    ("api_keys", [["acme", "admin", "0123456789abcdef0123"], None]),
    # A line break after the name (a variable read from a file): "$" matched before it, the
    # schema "flowledger\n" was made, and the engine then failed with the event library's
    # bare ProgrammingError ('relation "flowledger.flowledger_events" does not exist')
    ("schema", "flowledger\n"),
]


@pytest.mark.parametrize(("name", "value"), REFUSED, ids=[f"{n}={v!r}"[:60] for n, v in REFUSED])
def test_a_setting_its_variable_would_refuse_is_refused_as_an_argument_naming_it(
    name: str, value: Any
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{name: value})
    assert refused.value.field == name
    with pytest.raises(ValidationError):
        Settings().with_overrides(**{name: value})


TAKEN: list[tuple[str, Any]] = [
    ("chain_key", b"k" * 16),
    ("chain_key", b"k" * 64),
    ("signing_key", b"k" * 32),
    ("llm_base_url", "http://127.0.0.1:8089/v1"),
    ("llm_api_key", "sk-123456789"),
    ("http_max_body_bytes", 1),
    ("http_rate_burst", 1),
    ("http_max_tenant_engines", 1),
    ("group_commit_leaders", 1),
    ("api_keys", (("acme", "admin", "0123456789abcdef0123"),)),
    ("api_keys", [("acme", "admin", "0123456789abcdef0123")]),
]


@pytest.mark.parametrize(("name", "value"), TAKEN, ids=[f"{n}={v!r}"[:60] for n, v in TAKEN])
def test_a_setting_within_its_rule_is_taken(name: str, value: Any) -> None:
    assert getattr(Settings(**{name: value}), name) == (tuple(value) if name == "api_keys" else value)


def test_a_schema_variable_with_a_line_break_after_it_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings.from_env({"FLOWLEDGER_SCHEMA": "flowledger\n"})
    assert refused.value.field == "schema"
