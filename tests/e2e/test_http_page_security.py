"""The dashboard's pages against another site's page: no sign-in or sign-out posted from it, no
framing by it, no script of any kind in the pages, and nothing of a tenant kept by a cache."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.auth import COOKIE
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.live_http import ACME_READER, GLOBEX_WRITER, KEYS, bearer, live_server
from tests.support.browser import dom_after_scripts

# A name only globex's call carries: seeing it means the page shows globex's data.
GLOBEX_MODEL = "globex-private-model"
XSS = '<script>document.title="owned"</script>"><img src=x onerror="document.title=1">\u202e'
XSS_IN_SCRIPT = json.dumps(XSS).replace("<", "\\u003c")  # no </script> in the probe's script
# A page of the server's own origin (added to the app by the test) that frames globex's
# dashboard (the key in the address: the site allows it) and writes what the browser made of it.
PROBE = f"""<!doctype html><html><body>
<iframe id="page" src="/dashboard?since=1h&key={GLOBEX_WRITER}" style="width:1000px;height:2400px"></iframe>
<pre id="out">pending</pre><script>
const frame = document.getElementById("page");
frame.addEventListener("load", () => {{
  const doc = frame.contentDocument;
  document.getElementById("out").textContent = JSON.stringify({{
    title: doc.title,
    scripts: doc.querySelectorAll("script").length,
    images: doc.querySelectorAll("img").length,
    names: doc.body.textContent.includes({XSS_IN_SCRIPT}),
    margin: getComputedStyle(doc.body).marginLeft,
  }});
}});
</script></body></html>"""


def _usage(model: str) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model=model,
        response_model=model,
        input_tokens=10,
        output_tokens=5,
        cost_usd=Decimal("0.001"),
        latency_ms=12.0,
    )


@pytest.fixture
def site(database_url: str, pg_schema: str) -> Iterator[str]:
    """A keyed server on PostgreSQL: acme with a call, globex with a call under a model name of
    its own and a workflow and step named with markup."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, tenant="acme", api_keys=KEYS, dashboard_url_keys=True
    )
    with Engine(settings=settings) as acme, Engine(settings=replace(settings, tenant="globex")) as globex:
        acme.start_session("a-1", "support")
        acme.record_step("a-1", "greet", usage=_usage("acme-model"))
        globex.start_session("g-1", f"wf{XSS}", metadata={"note": XSS})
        globex.record_step("g-1", f"step{XSS}", usage=_usage(GLOBEX_MODEL))
        globex.record_step("g-1", "answer", usage=_usage(f"model{XSS}"))
        app = create_app(acme, require_keys=True)
        app.add_api_route("/__probe", lambda: HTMLResponse(PROBE), include_in_schema=False)
        signin = _sign_in_page("", GLOBEX_WRITER)
        app.add_api_route("/__signin", lambda: HTMLResponse(signin), include_in_schema=False)
        with live_server(app) as base_url:
            yield base_url


def _sign_in_page(target: str, key: str) -> str:
    """A page that posts the login form to ``target`` (this origin when empty) with ``key`` as
    soon as it loads, as a person submitting the form does."""
    return (
        f'<!doctype html><html><body><form id="f" method="post" action="{target}/dashboard/login">'
        f'<input name="key" value="{key}">'
        '</form><script>document.getElementById("f").submit();</script></body></html>'
    )


def _attacker(target: str, key: str) -> FastAPI:
    """A page of another origin (another port: the same site, which SameSite does not tell
    apart) that posts the login form to ``target`` with ``key``."""
    page = _sign_in_page(target, key)
    app = FastAPI()
    app.add_api_route("/", lambda: HTMLResponse(page))
    return app


def test_the_login_form_posted_from_the_servers_own_page_signs_the_browser_in(site: str) -> None:
    # Given the server's own origin posting its login form, as a person signing in does
    # When a browser opens it
    dom = dom_after_scripts(f"{site}/__signin")
    # Then the browser is signed in and shown the key's tenant
    assert "<title>flowledger dashboard</title>" in dom
    assert GLOBEX_MODEL in dom


def test_a_sign_in_posted_by_another_sites_page_does_not_sign_the_browser_in(site: str) -> None:
    # Given a page of another origin that posts the login form with globex's key (login CSRF: the
    # victim would then read, and act on, the attacker's figures as if they were their own)
    with live_server(_attacker(site, GLOBEX_WRITER)) as attacker:
        # When a browser opens it
        dom = dom_after_scripts(f"{attacker}/")
    # Then it is not signed in: the server refused the form and set no cookie
    assert GLOBEX_MODEL not in dom
    assert "flowledger dashboard" not in dom
    assert "another site" in dom


def test_a_sign_in_or_out_from_another_origin_is_403_and_leaves_the_cookie_alone(site: str) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        # What a browser sends with a form posted by another site's page
        for headers in (
            {"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"},
            {"Origin": "http://attacker.example"},
            {"Sec-Fetch-Site": "same-site"},  # a sibling subdomain, or another port
            {"Origin": "null"},  # a sandboxed frame, a data: page
        ):
            refused = client.post("/dashboard/login", data={"key": ACME_READER}, headers=headers)
            assert refused.status_code == 403, headers
            assert "set-cookie" not in refused.headers
            assert "another site" in refused.text
            assert client.post("/dashboard/logout", headers=headers).status_code == 403
        # The server's own form (same origin), and a client that is no browser, sign in
        own = {"Origin": site, "Sec-Fetch-Site": "same-origin"}
        signed = client.post("/dashboard/login", data={"key": ACME_READER}, headers=own)
        assert signed.status_code == 303
        assert str(client.cookies.get(COOKIE)).startswith("fls1.")  # a session, not the key
        # A sign-out from another site leaves the browser signed in
        foreign = {"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"}
        assert client.post("/dashboard/logout", headers=foreign).status_code == 403
        assert client.get("/dashboard").status_code == 200
        assert client.post("/dashboard/logout", headers=own).status_code == 303
        assert client.post("/dashboard/login", data={"key": ACME_READER}).status_code == 303


def _pages(client: httpx.Client) -> dict[str, httpx.Response]:
    return {
        "dashboard": client.get("/dashboard", params={"since": "1h"}, headers=bearer(GLOBEX_WRITER)),
        "login": client.get("/dashboard"),
        "failed login": client.post("/dashboard/login", data={"key": "nope"}),
        "invalid window": client.get("/dashboard", params={"since": "0h"}, headers=bearer(GLOBEX_WRITER)),
    }


def test_pages_and_answers_that_carry_a_tenants_data_are_not_stored_by_any_cache(site: str) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        answers = {
            **_pages(client),
            "session": client.get("/v1/sessions/g-1", headers=bearer(GLOBEX_WRITER)),
            "analytics": client.get("/v1/dashboard", headers=bearer(GLOBEX_WRITER)),
            "refusal": client.get("/v1/sessions/g-1"),
        }
        assert GLOBEX_MODEL in answers["dashboard"].text
        for name, answer in answers.items():
            assert answer.headers.get("cache-control") == "no-store", name
            assert answer.headers.get("x-content-type-options") == "nosniff", name
            assert answer.headers.get("x-frame-options") == "SAMEORIGIN", name


def test_the_pages_policy_allows_no_script_and_no_other_sites_frame(site: str) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        for name, page in _pages(client).items():
            policy = page.headers.get("content-security-policy", "")
            directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
            assert directives.get("default-src") == "'none'", name
            assert "script-src" not in directives, name  # so default-src 'none': no script at all
            assert directives.get("frame-ancestors") == "'self'", name
            assert directives.get("base-uri") == "'none'", name
            assert directives.get("form-action") == "'self'", name
            assert "unsafe-inline" not in directives.get("style-src", ""), name
        answer = client.get("/v1/sessions/g-1", headers=bearer(GLOBEX_WRITER))
        assert answer.headers.get("content-security-policy") == "default-src 'none'; frame-ancestors 'self'"


def test_the_signed_in_page_shows_names_with_markup_as_text_and_keeps_its_styles_under_its_policy(
    site: str,
) -> None:
    # Given globex's workflow, step and model names holding <script> and an <img onerror>,
    # when a page of the server's own origin frames globex's dashboard and reports what the
    # browser made of it
    dom = dom_after_scripts(f"{site}/__probe")
    report = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    assert report is not None, dom
    # Then the names are text: no element of theirs ran or loaded, and the page's own <style>
    # applies under the hash its policy names
    assert report.group(1) == (
        '{"title":"flowledger dashboard","scripts":0,"images":0,"names":true,"margin":"24px"}'
    )


def test_the_cookie_is_secure_when_a_proxy_on_this_machine_says_the_browser_came_over_https(
    site: str,
) -> None:
    with httpx.Client(base_url=site, timeout=60) as client:
        behind_tls = client.post(
            "/dashboard/login", data={"key": ACME_READER}, headers={"X-Forwarded-Proto": "https"}
        )
        plain = client.post("/dashboard/login", data={"key": ACME_READER})
    assert behind_tls.status_code == plain.status_code == 303
    assert "; secure" in behind_tls.headers["set-cookie"].lower()
    assert "secure" not in plain.headers["set-cookie"].lower()


def _session(client: httpx.Client, key: str) -> str:
    signed = client.post("/dashboard/login", data={"key": key})
    assert signed.status_code == 303, signed.text
    return str(signed.cookies.get(COOKIE))


def test_two_different_sign_ins_in_one_request_open_neither_tenants_page(site: str) -> None:
    # Given the browser's own sign-in (acme) and one another site tossed in beside it (globex: a
    # sibling subdomain can set a cookie for /dashboard; the browser then sends both)
    with httpx.Client(base_url=site, timeout=60) as client:
        acme, globex = _session(client, ACME_READER), _session(client, GLOBEX_WRITER)
        for cookie in (f"{COOKIE}={acme}; {COOKIE}={globex}", f"{COOKIE}={globex}; {COOKIE}={acme}"):
            # When the page is asked for with both
            page = client.get("/dashboard", headers={"Cookie": cookie})
            # Then neither acts (which would be a guess: the last one did, the tossed one): the form
            assert page.status_code == 401, page.text[:300]
            assert GLOBEX_MODEL not in page.text
            assert "two different" in page.text
        # And one sign-in alone still opens its page, a cookie sent twice alike too
        same = client.get("/dashboard", headers={"Cookie": f"{COOKIE}={globex}; {COOKIE}={globex}"})
        assert same.status_code == 200
        assert GLOBEX_MODEL in same.text
