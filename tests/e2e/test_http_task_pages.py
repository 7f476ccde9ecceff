"""``GET /v1/tasks`` says when a page was cut at its limit: a ``Link`` header (RFC 8288) with
``rel="next"``, the same request with ``after`` the page's last task, as the CLI prints "more
after ID". A list of exactly ``limit`` tasks looked the same as a page with more behind it."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient


def next_page(response_link: str | None) -> str | None:
    if response_link is None:
        return None
    found = re.fullmatch(r'<([^>]+)>; rel="next"', response_link)
    assert found is not None, response_link
    return found.group(1)


def test_a_page_cut_at_its_limit_links_the_next_and_the_last_page_links_none(
    memory_http: TestClient,
) -> None:
    # Given five tasks, two of them high priority with ids a client must escape
    for n, priority in enumerate(["high", "low", "high", "high", "low"]):
        created = memory_http.post(
            "/v1/tasks", json={"task_id": f"T {n}&x", "description": "d", "priority": priority}
        )
        assert created.status_code == 201, created.text

    # When the high ones are read two at a time, following the links
    seen: list[str] = []
    pages = 0
    url: str | None = "/v1/tasks?priority=high&limit=2"
    while url is not None:
        response = memory_http.get(url)
        assert response.status_code == 200, response.text
        seen += [task["task_id"] for task in response.json()]
        pages += 1
        url = next_page(response.headers.get("link"))
        assert pages <= 3

    # Then every one is read once, the filter kept, and the last page links nowhere
    assert seen == ["T 0&x", "T 2&x", "T 3&x"]
    assert pages == 2


def test_a_list_of_exactly_the_limit_links_no_next_page(memory_http: TestClient) -> None:
    for n in range(2):
        memory_http.post("/v1/tasks", json={"task_id": f"T-{n}", "description": "d"})
    response = memory_http.get("/v1/tasks?limit=2")
    assert len(response.json()) == 2
    assert "link" not in response.headers
    assert "link" not in memory_http.get("/v1/tasks").headers
