"""A budget's webhook never makes the server call its own network unless allowed: a literal
loopback, private, link-local or reserved address (in any spelling a resolver takes) is
refused when the budget is set over HTTP or the CLI (422 / exit 2, nothing written), and a
name is resolved and checked before each delivery. ``FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE=1``
allows them (a receiver on the operator's own network)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm.alerts import (
    WebhookNotifier,
    destination_refusal,
    pinned_request,
    resolved_refusal,
)
from flowledger.domain.budget import BudgetAlert, BudgetSpec
from flowledger.infrastructure import Engine, Settings
from tests.conftest import make_settings
from tests.integration.test_budgets import Receiver
from tests.support.cli import run_cli

NOT_PUBLIC = [
    "http://127.0.0.1:8080/hook",
    "http://127.1/hook",
    "http://2130706433/hook",
    "http://0x7f.0.0.1/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://172.16.0.1/hook",
    "http://100.64.0.1/hook",
    "http://0.0.0.0/hook",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://localhost:9000/hook",
    "http://api.localhost/hook",
    "http://LOCALHOST./hook",
    "http://0177.0.0.1/hook",
    "http://example.com@127.0.0.1/hook",
    "http://[fe80::1%25eth0]/hook",
    "http://example.com\\@10.0.0.1/hook",
    "http://[::127.0.0.1]/hook",
    "http://[64:ff9b::7f00:1]/hook",
    "http://[2002:7f00:1::]/hook",
    "http://224.0.0.1/hook",
    "http://①②⑦.0.0.1/hook",
    "http://%31%32%37.0.0.1/hook",
]


@pytest.mark.parametrize("url", NOT_PUBLIC)
def test_a_destination_that_is_not_public_is_named(url: str) -> None:
    refusal = destination_refusal(url)
    assert refusal is not None
    assert "not a public address" in refusal or "this machine" in refusal


@pytest.mark.parametrize(
    "url", ["https://hooks.example.com/budget", "http://8.8.8.8/x", "https://[2606:4700::1]/"]
)
def test_a_public_destination_passes(url: str) -> None:
    assert destination_refusal(url) is None


async def test_a_name_is_judged_by_every_address_it_resolves_to(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a resolver that answers each name with its own addresses
    answers = {
        "public.example": ["93.184.216.34"],
        "inside.example": ["10.0.0.7"],
        "both.example": ["93.184.216.34", "::1"],
    }

    async def getaddrinfo(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        if host not in answers:
            raise OSError(f"no such name {host}")
        return [(None, None, None, "", (address, port)) for address in answers[host]]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo)
    # Then a name is refused when any of its addresses is not public, or when it does not resolve
    assert await resolved_refusal("https://public.example/hook") is None
    assert await resolved_refusal("https://inside.example/hook") == (
        "inside.example resolves to 10.0.0.7, which is not a public address"
    )
    assert "resolves to ::1" in (await resolved_refusal("http://both.example:8080/hook") or "")
    assert "does not resolve" in (await resolved_refusal("http://nowhere.example/hook") or "")
    # And a literal address is judged without asking the resolver
    assert await resolved_refusal("http://10.0.0.8/hook") == "10.0.0.8 is not a public address"


def alert(url: str) -> BudgetAlert:
    spec = BudgetSpec(scope="workflow", subject="w", period="day", limit_usd=Decimal(1), webhook_url=url)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    return BudgetAlert(
        tenant="t", spec=spec, budget_id="b1", window_start=start, threshold=80, spent_usd=Decimal("0.8")
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


async def test_an_alert_to_a_loopback_receiver_is_not_sent_unless_allowed(receiver: Receiver) -> None:
    # Given a receiver on loopback
    refusing, allowing = WebhookNotifier(), WebhookNotifier(allow_private=True, initial_wait_s=0.01)
    # When an alert names it, by address and by a name that resolves to it
    for url in (receiver.url, receiver.url.replace("127.0.0.1", "localhost")):
        refusing.notify(alert(url), "secret")
    await refusing.drain(5)
    # Then nothing is sent, and both are counted as refused
    assert (refusing.refused, refusing.failed, refusing.delivered) == (2, 2, 0)
    assert receiver.requests == []
    # And with private destinations allowed, the same alert arrives
    allowing.notify(alert(receiver.url), "secret")
    await allowing.drain(5)
    assert (allowing.refused, allowing.delivered) == (0, 1)
    assert len(receiver.requests) == 1


def test_alerts_sent_from_synchronous_code_are_checked_too(receiver: Receiver) -> None:
    refusing = WebhookNotifier()
    refusing.notify(alert(receiver.url), None)  # no running loop: a thread of its own
    refusing.join_threads(5)
    assert (refusing.refused, receiver.requests) == (1, [])


@pytest.fixture
def http(database_url: str, pg_schema: str) -> Iterator[TestClient]:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    with TestClient(create_app(engine)) as client:
        yield client
    engine.close()


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest", "http://[::1]:9/x", "http://localhost/x"])
def test_over_http_a_budget_naming_a_private_destination_is_a_422_and_not_set(
    http: TestClient, url: str
) -> None:
    response = http.put("/v1/budgets/workflow/support/day", json={"limit_usd": "5", "webhook_url": url})
    assert response.status_code == 422, response.text
    assert "webhook_url:" in response.json()["error"]
    assert "FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE=1" in response.json()["error"]
    assert http.get("/v1/budgets").json() == []


@pytest.mark.parametrize(
    "url",
    [
        "https://:80/x",
        "https://example.com:99999/x",
        "https://example.com:0/x",
        "https://exa mple.com/x",
        "https://exa\u0000mple.com/x",
        "https://example.com/\nx",
        "ftp://example.com/x",
    ],
)
def test_over_http_a_webhook_that_could_never_be_called_is_a_422(http: TestClient, url: str) -> None:
    response = http.put("/v1/budgets/workflow/support/day", json={"limit_usd": "5", "webhook_url": url})
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith("webhook_url: must be an absolute http(s) URL")
    assert http.get("/v1/budgets").json() == []


def test_over_http_a_public_destination_is_set_and_allowing_private_ones_takes_loopback(
    database_url: str, pg_schema: str
) -> None:
    for allow, url in ((False, "https://hooks.example.com/b"), (True, "http://127.0.0.1:9/b")):
        settings = make_settings(database_url=database_url, schema=pg_schema, webhook_allow_private=allow)
        engine = Engine(settings=settings)
        with TestClient(create_app(engine)) as client:
            response = client.put(
                "/v1/budgets/workflow/support/day", json={"limit_usd": "5", "webhook_url": url}
            )
            assert response.status_code == 200, response.text
            assert response.json()["budget"]["webhook_url"] == url
        engine.close()


def test_the_cli_refuses_a_private_destination_with_exit_2(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLOWLEDGER_HOME", str(tmp_path))
    args = ("budgets", "set", "workflow", "support", "--limit", "5", "--mode", "alert")
    refused = run_cli(database_url, pg_schema, *args, "--webhook-url", "http://10.0.0.1/hook")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().startswith("error: webhook_url: 10.0.0.1 is not a public address")
    assert "support" not in run_cli(database_url, pg_schema, "budgets", "list").stdout
    monkeypatch.setenv("FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE", "1")
    allowed = run_cli(database_url, pg_schema, *args, "--webhook-url", "http://10.0.0.1/hook")
    assert allowed.returncode == 0, allowed.stderr

    assert "support" in run_cli(database_url, pg_schema, "budgets", "list").stdout


def test_the_setting_is_read_from_the_environment_and_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE", raising=False)
    assert Settings.from_env().webhook_allow_private is False
    monkeypatch.setenv("FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE", "1")
    assert Settings.from_env().webhook_allow_private is True


async def test_the_alert_log_never_carries_the_credentials_a_webhook_url_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given webhooks whose URL carries a password: one refused as not public, one whose
    # receiver answers 404, one whose receiver answers 503 until the notifier gives up
    def answering(status: int) -> WebhookNotifier:
        client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(status)))
        return WebhookNotifier(client=client, allow_private=True, attempts=2, initial_wait_s=0.01)

    cases = [
        (WebhookNotifier(), "http://ops:hunter2@localhost:9/hook", "not called"),
        (answering(404), "https://ops:hunter2@hooks.example/hook", "refused: 404"),
        (answering(503), "https://ops:hunter2@hooks.example/hook", "gave up after 2 attempts"),
    ]
    with caplog.at_level(logging.WARNING, logger="flowledger.adapters.llm.alerts"):
        for notifier, url, _ in cases:
            # When an alert is delivered to it
            notifier.notify(alert(url), "secret")
            await notifier.drain(5)
            await notifier.aclose()
    # Then each outcome is logged, naming the host and the user masked, never the password
    lines = [record.getMessage() for record in caplog.records]
    for (_, _, outcome), line in zip(cases, lines, strict=True):
        assert outcome in line
        assert "***@" in line
        assert "hunter2" not in line


async def test_an_alert_goes_to_the_address_that_was_checked_not_to_a_second_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a name whose first answer is public and every later one loopback (DNS rebinding: the
    # check sees a public address, a second lookup by the HTTP client would reach the inside)
    lookups: list[str] = []

    async def getaddrinfo(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        lookups.append(host)
        address = "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"
        return [(None, None, None, "", (address, port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo)
    sent: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(204)

    client = httpx.AsyncClient(transport=httpx.MockTransport(receive))
    notifier = WebhookNotifier(client=client)
    # When an alert is delivered to it
    notifier.notify(alert("https://ops:pw@rebind.example:8443/hook?x=1"), "secret")
    await notifier.drain(5)
    await notifier.aclose()
    # Then the request is addressed to the address checked, under the name it was given (its
    # Host header, and the name TLS checks the certificate against), with its credentials
    assert notifier.delivered == 1
    assert lookups == ["rebind.example"]
    (request,) = sent
    assert str(request.url) == "https://ops:pw@93.184.216.34:8443/hook?x=1"
    assert request.headers["host"] == "rebind.example:8443"
    assert request.extensions["sni_hostname"] == "rebind.example"
    assert request.headers["authorization"].startswith("Basic ")


async def test_with_private_destinations_allowed_an_alert_goes_to_its_url_as_written() -> None:
    sent: list[httpx.Request] = []
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(204)))
    notifier = WebhookNotifier(client=client, allow_private=True)
    notifier.notify(alert("http://hooks.internal:8080/hook"), None)
    await notifier.drain(5)
    await notifier.aclose()
    assert [str(request.url) for request in sent] == ["http://hooks.internal:8080/hook"]
    assert "sni_hostname" not in sent[0].extensions


def _certificate_for(name: str, folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``name`` and its key, as PEM files in ``folder``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_a_call_made_at_the_checked_address_still_checks_the_certificate_against_the_name(
    tmp_path: Path,
) -> None:
    # Given a TLS receiver on loopback whose certificate names hooks.test, not its address
    cert, key = _certificate_for("hooks.test", tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoContent)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://hooks.test:{server.server_address[1]}/hook"
    trusting = ssl.create_default_context(cafile=str(cert))
    try:
        with httpx.Client(verify=trusting, timeout=5) as client:
            # When the call to hooks.test is made at the address it was checked at
            target, headers, extensions = pinned_request(url, "127.0.0.1")
            answer = client.post(target, content=b"{}", headers=headers, extensions=extensions)
            # Then TLS checked the certificate against the name, and the receiver saw the name
            assert answer.status_code == 204
            assert _NoContent.hosts[-1] == f"hooks.test:{server.server_address[1]}"
            # And the address alone would not have passed the check
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                client.post(target, content=b"{}", headers=headers)
    finally:
        server.shutdown()
        server.server_close()


class _NoContent(BaseHTTPRequestHandler):
    """Answers every POST 204, noting its Host header."""

    hosts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.hosts.append(self.headers["Host"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


async def test_a_redirect_from_the_receiver_is_not_followed_to_where_it_points() -> None:
    # Given a public receiver that answers every alert with a redirect to the metadata service
    sent: list[httpx.Request] = []

    def redirect(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(307, headers={"Location": "http://169.254.169.254/latest/meta-data"})

    # (through a client that would follow redirects: the notifier's calls never do)
    client = httpx.AsyncClient(transport=httpx.MockTransport(redirect), follow_redirects=True)
    notifier = WebhookNotifier(client=client)
    notifier.notify(alert("https://93.184.216.34/hook"), "secret")
    await notifier.drain(5)
    await notifier.aclose()
    # Then only the receiver was called, once: a 3xx is a final answer, counted as failed
    assert [request.url.host for request in sent] == ["93.184.216.34"]
    assert (notifier.delivered, notifier.failed) == (0, 1)
