"""A refusal quotes the caller's own input no further than a bounded excerpt, with every character
a terminal or a bidi-aware reader would act on written as its escape (`api.refusal_text`).

Each case was answered before (2026-11-28) with the caller's text quoted whole and raw: an OSC 52
clipboard write, a bidi override, a C1 CSI; 53 KB back for a 64 KiB rule; 591 KB back for a 59 KB
send of unknown keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from api.refusal_text import MAX_LISTED_ERRORS, MAX_QUOTE_CHARS, MAX_TEXT_CHARS
from tests.fixtures.answers import refused
from tests.fixtures.sends import email_send, stored_as_before

# An OSC 52 clipboard write, a bidi override, a newline and a C1 CSI (clears a terminal's screen).
EVIL = "\x1b]52;c;aGk=\x07\u202egnp.exe\n\x9b2J"
RULE = {"scope": "tenant", "limit": 10, "period_s": 60}


def texts(value: Any) -> Iterator[str]:
    """Every text in a decoded JSON value, keys too."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from texts(v)


def assert_inert(error: dict[str, Any]) -> None:
    for text in texts(error):
        assert text.isprintable(), ascii(text)
        assert len(text) <= MAX_TEXT_CHARS + len("..."), len(text)


def raw(body: Any) -> dict[str, Any]:
    return {
        "content": json.dumps(body, separators=(",", ":")).encode(),
        "headers": {"content-type": "application/json"},
    }


async def test_an_unknown_provider_is_quoted_back_as_an_inert_excerpt(client: httpx.AsyncClient) -> None:
    body = {**RULE, "scope": "provider", "provider": EVIL * 700}
    response = await client.post("/v1/rate-limits", **raw(body))
    error = refused(response, 422)
    assert_inert(error)
    assert "unknown provider '\\x1b]52;c;aGk=\\x07\\u202egnp.exe\\n\\x9b2J" in error["message"]
    assert len(response.content) < 2_000  # 53 KB before


async def test_an_unknown_key_is_named_by_an_inert_excerpt_and_its_value_never(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/rate-limits", **raw({**RULE, EVIL * 700: "the-value-of-the-key"}))
    error = refused(response, 422)
    assert_inert(error)
    [detail] = error["details"]
    assert detail["type"] == "extra_forbidden" and len(detail["field"]) <= MAX_QUOTE_CHARS + len("...")
    assert "the-value-of-the-key" not in response.text  # pydantic's `input` stays out of the answer


async def test_a_send_of_7000_unknown_keys_lists_twenty_and_counts_the_rest(
    client: httpx.AsyncClient,
) -> None:
    body = {**email_send(), **{f"{i:x}": 1 for i in range(7_000)}}
    response = await client.post("/v1/notifications", **raw(body))
    error = refused(response, 422)
    assert len(error["details"]) == MAX_LISTED_ERRORS + 1
    assert error["details"][-1] == {
        "field": "body",
        "message": f"{7_000 - MAX_LISTED_ERRORS:,} more errors not listed",
        "type": "too_many_errors",
    }
    assert len(response.content) < 5_000  # 591 KB before


async def test_a_batch_of_such_items_is_answered_in_fewer_bytes_than_it_sent(
    client: httpx.AsyncClient,
) -> None:
    keys = {f"{i:x}": 1 for i in range(490)}
    body = {"notifications": [{**email_send(), **keys} for _ in range(200)]}
    request = raw(body)
    response = await client.post("/v1/notifications/batch", **request)
    assert response.status_code == 202, response.text[:500]
    results = response.json()["results"]
    assert len(results) == 200 and all(len(r["error"]["details"]) == MAX_LISTED_ERRORS + 1 for r in results)
    assert len(response.content) < len(request["content"])  # ten times as much before


async def test_a_bad_id_in_the_path_is_refused_without_its_bidi_override(client: httpx.AsyncClient) -> None:
    error = refused(await client.get("/v1/rate-limits/%E2%80%AE%1B"), 422)  # pydantic quotes the character
    assert_inert(error)
    assert "\\u202e" in error["message"]
    error = refused(await client.get("/v1/users/%1B%5B2J%E2%80%AEx"), 404)
    assert_inert(error)
    assert error["message"] == "No user '\\x1b[2J\\u202ex'."


async def test_a_reused_event_id_is_quoted_inert(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    """An event id stored before ids had to be printable (a new one is refused: test_hostile_ids)."""
    send = email_send()
    accepted = await client.post("/v1/notifications", json=send)
    assert accepted.status_code == 202
    send["event_id"] = f"evt-{EVIL}"
    await stored_as_before(engine, accepted.json()["id"], send)
    again = await client.post("/v1/notifications", json={**send, "data": {"order_id": "other"}})
    error = refused(again, 409)
    assert error["code"] == "event_id_conflict"
    assert_inert(error)
    assert "'evt-\\x1b]52;c;aGk=\\x07\\u202egnp.exe\\n\\x9b2J'" in error["message"]


async def test_a_template_error_quotes_a_30000_character_name_no_further_than_the_bound(
    client: httpx.AsyncClient,
) -> None:
    for source in ["{% " + "a" * 30_000 + " %}", "{{ " + "b" * 30_000 + " }}"]:
        send = email_send(template=None, content={"subject": "s", "body": source}, data={})
        response = await client.post("/v1/notifications", json=send)
        error = refused(response, 422)
        assert error["code"] in ("template_syntax_error", "missing_template_variable")
        assert_inert(error)
        assert len(response.content) < 2_000  # 30-60 KB before


async def test_a_refused_phone_number_is_quoted_inert(client: httpx.AsyncClient) -> None:
    error = refused(await client.put("/v1/users/u-1", json={"phone": EVIL * 100}), 422)
    assert_inert(error)
    assert error["details"][0]["message"].startswith("Value error, '\\x1b]52;c;aGk=\\x07\\u202e")
