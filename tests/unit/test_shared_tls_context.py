"""Every HTTP client flowledger makes shares one TLS context per process: building one reads and
parses the CA bundle (about 18 ms of CPU each on the project's machine), and a server with an
engine per tenant, or a test run with an engine per test, made a new one for every client."""

from __future__ import annotations

import ssl

from flowledger.adapters.llm import ApiKey, ClientConfig
from flowledger.adapters.llm.transport import (
    AiohttpTransport,
    ShardedTransport,
    build_transport,
    shared_tls_context,
)


def test_the_context_is_built_once_and_verifies_certificates() -> None:
    # Given / When
    first, second = shared_tls_context(), shared_tls_context()

    # Then
    assert first is second
    assert first.verify_mode == ssl.CERT_REQUIRED
    assert first.check_hostname
    assert first.cert_store_stats()["x509_ca"] > 0


def test_both_transports_take_the_shared_context() -> None:
    # Given
    key = ApiKey("sk-test-secret-1")
    sharded = build_transport(ClientConfig(base_url="http://127.0.0.1:1/v1", api_key=key, transport="httpx"))
    aiohttp_based = build_transport(ClientConfig(base_url="http://127.0.0.1:1/v1", api_key=key))

    # Then
    assert isinstance(sharded, ShardedTransport)
    assert all(pool._pool._ssl_context is shared_tls_context() for pool in sharded.pools)
    assert isinstance(aiohttp_based, AiohttpTransport)
    assert aiohttp_based.ssl_context is shared_tls_context()
