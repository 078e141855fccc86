"""The template API: versions, one active version, previews, and refusal of what does not render."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.template_list import encode_cursor
from tests.fixtures.answers import assert_error


def sms_template(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "reminder",
        "channel": "sms",
        "body": "Hi {{ name }}, see you at {{ time }}",
        "sample_data": {"name": "Ada", "time": "10:00"},
    }
    body.update(overrides)
    return body


async def test_new_versions_are_numbered_and_only_the_newest_is_active(client: httpx.AsyncClient) -> None:
    first = await client.post("/v1/templates", json=sms_template())
    second = await client.post(
        "/v1/templates", json=sms_template(body="Reminder for {{ name }} at {{ time }}")
    )
    assert (first.status_code, second.status_code) == (201, 201), (first.text, second.text)
    assert (first.json()["version"], second.json()["version"]) == (1, 2)
    versions = (await client.get("/v1/templates/reminder")).json()
    assert [(v["version"], v["active"]) for v in versions] == [(2, True), (1, False)]

    preview = await client.post(
        "/v1/templates/reminder/preview", json={"channel": "sms", "data": {"name": "Lin", "time": "9"}}
    )
    assert preview.status_code == 200, preview.text
    assert preview.json()["body"] == "Reminder for Lin at 9"


async def test_an_older_version_can_be_activated_again(client: httpx.AsyncClient) -> None:
    await client.post("/v1/templates", json=sms_template())
    await client.post("/v1/templates", json=sms_template(body="v2 {{ name }} {{ time }}"))
    activated = await client.post(
        "/v1/templates/reminder/activate", json={"channel": "sms", "locale": "en", "version": 1}
    )
    assert activated.status_code == 200 and activated.json()["active"] is True
    preview = await client.post(
        "/v1/templates/reminder/preview", json={"channel": "sms", "data": {"name": "A", "time": "1"}}
    )
    assert preview.json()["version"] == 1 and preview.json()["body"] == "Hi A, see you at 1"
    missing = await client.post(
        "/v1/templates/reminder/activate", json={"channel": "sms", "locale": "en", "version": 9}
    )
    assert_error(missing, 404, "unknown_template")


async def test_template_whose_sample_data_does_not_render_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/templates", json=sms_template(sample_data={"name": "Ada"}))
    error = assert_error(response, 422, "missing_template_variable")
    assert error["details"] == {"variable": "time"}
    assert_error(await client.get("/v1/templates/reminder"), 404, "unknown_template")


async def test_preview_names_the_exact_missing_variable(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/templates/order_shipped/preview", json={"channel": "email", "data": {"name": "Ada"}}
    )
    error = assert_error(response, 422, "missing_template_variable")
    assert error["details"] == {"variable": "order_id"}


async def test_preview_uses_locale_fallback_and_escapes_only_html(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/templates/order_shipped/preview",
        json={"channel": "email", "locale": "pt-BR", "data": {"order_id": "<b>7</b>"}},
    )
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["locale"] == "pt"
    assert out["subject"] == "Seu pedido <b>7</b> foi enviado"
    assert "&lt;b&gt;7&lt;/b&gt;" in out["html"]


@pytest.mark.parametrize(
    ("attack", "code"),
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe_template"),
        ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "unsafe_template"),
        ("{{ self._TemplateReference__context }}", "unsafe_template"),
        ("{{ cycler|attr('_'*2 ~ 'init' ~ '_'*2) }}", "unsafe_template"),
        ("{% include '/etc/passwd' %}", "template_syntax_error"),
    ],
)
async def test_template_reaching_python_internals_is_refused(
    client: httpx.AsyncClient, attack: str, code: str
) -> None:
    response = await client.post("/v1/templates", json=sms_template(body=attack, sample_data={}))
    error = assert_error(response, 422, code)
    assert "root:" not in error["message"] and "uid=" not in error["message"]
    assert_error(await client.get("/v1/templates/reminder"), 404, "unknown_template")


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"channel": "email"}, "subject"),
        ({"channel": "sms", "html": "<p>x</p>"}, "html"),
        ({"channel": "push", "subject": "x"}, "subject"),
    ],
)
async def test_parts_must_fit_the_channel(
    client: httpx.AsyncClient, overrides: dict[str, Any], words: str
) -> None:
    error = assert_error(
        await client.post("/v1/templates", json=sms_template(**overrides)), 422, "validation_error"
    )
    assert words in error["message"]


async def test_push_template_has_a_title_and_email_has_subject_text_and_html(
    client: httpx.AsyncClient,
) -> None:
    push = await client.post(
        "/v1/templates",
        json={
            "name": "ping",
            "channel": "push",
            "title": "Hi {{ name }}",
            "body": "Ping",
            "sample_data": {"name": "A"},
        },
    )
    assert push.status_code == 201 and push.json()["title"] == "Hi {{ name }}"
    email = await client.post(
        "/v1/templates",
        json={
            "name": "note",
            "channel": "email",
            "locale": "fr",
            "subject": "Note",
            "body": "Texte",
            "html": "<p>{{ x }}</p>",
            "sample_data": {"x": 1},
        },
    )
    assert email.status_code == 201, email.text
    assert (email.json()["locale"], email.json()["html"]) == ("fr", "<p>{{ x }}</p>")


async def test_shipped_defaults_are_there_for_a_new_tenant(client: httpx.AsyncClient) -> None:
    names = {(t["name"], t["channel"], t["locale"]) for t in (await client.get("/v1/templates")).json()}
    assert {("order_shipped", "email", "en"), ("order_shipped", "email", "pt"), ("otp", "sms", "en")} <= names


async def test_creating_templates_needs_the_admin_scope(api: Any, engine: Any) -> None:
    from harness.services import api_client
    from tests.conftest import make_tenant

    sender = await make_tenant(engine, scopes=("send", "read"))
    async with api_client(api.url, sender.key) as c:
        assert_error(await c.post("/v1/templates", json=sms_template()), 403, "forbidden")


async def test_versions_are_listed_a_page_at_a_time_with_a_link_to_the_next(
    client: httpx.AsyncClient,
) -> None:
    for i in range(4):
        assert (
            await client.post(
                "/v1/templates", json=sms_template(name="paged_a", body=f"A{i} {{{{ name }}}} {{{{ time }}}}")
            )
        ).status_code == 201
    for i in range(3):
        assert (
            await client.post(
                "/v1/templates", json=sms_template(name="paged_b", body=f"B{i} {{{{ name }}}} {{{{ time }}}}")
            )
        ).status_code == 201
    whole = (await client.get("/v1/templates", params={"limit": 50})).json()
    expected = [(t["name"], t["version"]) for t in whole if t["name"].startswith("paged_")]
    assert expected == [
        ("paged_a", 4),
        ("paged_a", 3),
        ("paged_a", 2),
        ("paged_a", 1),
        ("paged_b", 3),
        ("paged_b", 2),
        ("paged_b", 1),
    ]

    seen: list[tuple[str, int]] = []
    url: str | None = "/v1/templates/paged_a"
    params: dict[str, Any] | None = {"limit": 3}
    pages = 0
    while url is not None:
        page = await client.get(url, params=params)
        assert page.status_code == 200, page.text
        seen += [(t["name"], t["version"]) for t in page.json()]
        url, params, pages = page.links.get("next", {}).get("url"), None, pages + 1
    assert (seen, pages) == (expected[:4], 2)


def _cursor(*key: object) -> str:
    return encode_cursor(key)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cursor",
    [
        "x",
        "%%%",
        "W10",  # []
        _cursor("a", "b", "c", "d"),
        _cursor("a", "b", "c", 2**40),
        _cursor("a", "b", "c", 0),
        _cursor("a\x00", "sms", "en", 1),
        _cursor("\ud800", "sms", "en", 1),
        _cursor("a" * 129, "sms", "en", 1),
    ],
)
async def test_a_cursor_the_api_did_not_issue_is_a_422_invalid_cursor(
    client: httpx.AsyncClient, cursor: str
) -> None:
    assert_error(await client.get("/v1/templates", params={"cursor": cursor}), 422, "invalid_cursor")


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 51}, {"cursor": "a" * 1025}])
async def test_a_page_past_the_limits_is_a_422(client: httpx.AsyncClient, params: dict[str, Any]) -> None:
    assert_error(await client.get("/v1/templates", params=params), 422, "validation_error")
