"""How a key may be spelt in a request's headers, sent as raw bytes to a real uvicorn server
(httptools, as ``serve`` runs): the spaces HTTP allows around a value, and a header sent twice;
an API key's, and an idempotency key's."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.e2e.live_http import ACME_READER, ACME_WRITER, GLOBEX_WRITER, keyed_app, keyed_engine, live_server


@pytest.fixture
def acme(simulator: Simulator) -> Iterator[Engine]:
    engine = keyed_engine(simulator)
    engine.start_session("s1", "cs")
    yield engine
    engine.close()


@pytest.fixture
def server(acme: Engine) -> Iterator[str]:
    with live_server(keyed_app(acme)) as url:
        yield url


def status_of(
    url: str, headers: list[tuple[str, str]], path: str = "/v1/sessions/s1", body: str | None = None
) -> tuple[int, bytes]:
    """The status and body of a GET (or a POST of the JSON ``body``) whose header lines go out
    exactly as given (an HTTP client library would trim or refuse some of them)."""
    parts = urlsplit(url)
    if body is not None:
        length = str(len(body.encode()))
        headers = [*headers, ("Content-Type", "application/json"), ("Content-Length", length)]
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    method = "GET" if body is None else "POST"
    request = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n{lines}\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(request.encode("latin-1") + (body or "").encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    "header",
    [
        ("X-API-Key", f"{ACME_READER}  "),
        ("X-API-Key", f"{ACME_READER}\t"),
        ("X-API-Key", f"  {ACME_READER}"),
        ("x-api-key", ACME_READER),
        ("Authorization", f"Bearer {ACME_READER}  "),
        ("Authorization", f"Bearer   {ACME_READER}"),
        ("Authorization", f"bearer {ACME_READER}"),
    ],
)
def test_a_key_with_the_spaces_http_allows_around_a_header_value_is_the_key(
    server: str, header: tuple[str, str]
) -> None:
    # When a key is sent with spaces or a tab after it (HTTP says they are not part of the value;
    # httptools, unlike h11, leaves trailing ones in: X-API-Key was 401 where Bearer was 200)
    status, body = status_of(server, [header])
    # Then it is the key
    assert status == 200, body


@pytest.mark.parametrize("name", ["Authorization", "X-API-Key"])
def test_one_key_header_sent_twice_with_different_keys_is_refused(server: str, name: str) -> None:
    def spelt(key: str) -> str:
        return f"Bearer {key}" if name == "Authorization" else key

    # When one tenant's key and another's come in the same header twice (the first one acted,
    # unnoticed: globex's key read globex's session though acme's key was sent too)
    status, body = status_of(server, [(name, spelt(GLOBEX_WRITER)), (name, spelt(ACME_READER))])
    # Then neither acts: 401, as for a bearer token and an X-API-Key that differ
    assert status == 401, body
    assert b"two different API keys" in body
    # And the same key twice is one key
    assert status_of(server, [(name, spelt(ACME_READER)), (name, spelt(ACME_READER))])[0] == 200
    # And the dashboard page answers it with its login form, as every 401 of the page
    status, page = status_of(server, [(name, spelt(GLOBEX_WRITER)), (name, spelt(ACME_READER))], "/dashboard")
    assert status == 401
    assert b"two different API keys" in page


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (ACME_READER, "no scheme"),  # the key alone, the commonest slip
        (f"Token {ACME_READER}", "scheme 'Token'"),
        ("Basic dXNlcjpwYXNz", "scheme 'Basic'"),
        ("Bearer", "no key after 'Bearer'"),
    ],
)
def test_an_authorization_header_that_is_not_a_bearer_key_is_told_what_is_wrong(
    server: str, value: str, said: str
) -> None:
    """It answered "an API key is required", as to a request with no header at all, which left a
    caller who had sent its key without 'Bearer ' guessing."""
    # When the only key header is an Authorization header that holds no bearer key
    status, body = status_of(server, [("Authorization", value)])
    # Then it is a 401 that names what the header lacks and how to send a key
    assert status == 401
    error = json.loads(body)["error"]
    assert said in error, error
    assert "'Authorization: Bearer <key>'" in error
    assert ACME_READER not in error  # a key sent wrongly is never echoed


def test_an_idempotency_key_with_the_spaces_http_allows_around_it_is_the_key(
    server: str, acme: Engine
) -> None:
    """An outside probe: POST /v1/sessions/ws2/steps with 'Idempotency-Key: retry-1  ' recorded
    the step under 'retry-1  ' on a server running httptools (serve's default) and under
    'retry-1' on one running h11 (serve --http h11): the same request, sent again to the other
    server of one deployment (or through a proxy that trims), was recorded twice."""
    step = json.dumps({"step": "a", "input": {}, "output": {}})
    path = "/v1/sessions/s1/steps"
    # When one step is sent under one key, spelt with the spaces or tabs HTTP allows around a value
    spellings = ["retry-1", "retry-1  ", "retry-1\t", "  retry-1", "\tretry-1 \t"]
    sent = [[("X-API-Key", ACME_WRITER), ("Idempotency-Key", key)] for key in spellings]
    answers = [status_of(server, headers, path, step) for headers in sent]
    # Then it is recorded once, under the key without them
    assert [status for status, _ in answers] == [201] * len(spellings), answers
    assert {json.loads(body)["idempotency_key"] for _, body in answers} == {"retry-1"}
    assert acme.get_session("s1").step_count == 1
