"""Template store: locale fallback, versions, and the shipped defaults (over a migrated PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.pg import asyncpg_dsn
from core.render import Renderer
from core.templates import (
    DEFAULT_TEMPLATES_DIR,
    TemplateFileError,
    TemplateSource,
    install_default_templates,
    load_default_templates,
    locale_candidates,
    resolve_template,
)
from schema.db import create_engine, ensure_database, upgrade
from schema.ids import uuid7
from schema.models import Template, Tenant

PG_ADMIN_DSN = os.environ.get("CLARION_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
_templates = Template.__table__  # type: ignore[attr-defined]
_tenants = Tenant.__table__  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[AsyncEngine]:
    name = f"clarion_test_templates_{secrets.token_hex(4)}"
    url = f"{PG_ADMIN_DSN.rsplit('/', 1)[0].replace('postgresql://', 'postgresql+asyncpg://', 1)}/{name}"
    await ensure_database(url)
    try:
        await asyncio.to_thread(upgrade, url)
        eng = create_engine(url, pool_size=2)
        yield eng
        await eng.dispose()
    finally:
        admin = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def make_tenant(engine: AsyncEngine, *, default_locale: str = "en") -> str:
    tenant_id = f"t-{secrets.token_hex(4)}"
    async with engine.begin() as conn:
        await conn.execute(
            sa.insert(_tenants).values(id=tenant_id, name=tenant_id, default_locale=default_locale)
        )
    return tenant_id


async def add_template(engine: AsyncEngine, tenant_id: str, **values: Any) -> None:
    row = {"id": uuid7(), "tenant_id": tenant_id, "name": "receipt", "channel": "email", "locale": "en"}
    row |= {"version": 1, "active": True, "subject": "s", "body": "b"} | values
    async with engine.begin() as conn:
        await conn.execute(sa.insert(_templates).values(row))


async def resolve(engine: AsyncEngine, tenant_id: str, **kwargs: Any) -> TemplateSource | None:
    args: dict[str, Any] = {"name": "receipt", "channel": "email", "locale": None} | kwargs
    conn = await asyncpg.connect(asyncpg_dsn(engine.url.render_as_string(hide_password=False)))
    try:
        return await resolve_template(conn=conn, tenant_id=tenant_id, **args)
    finally:
        await conn.close()


def test_locale_candidates_go_from_region_to_language_to_default() -> None:
    assert locale_candidates("pt-BR", "en") == ["pt-BR", "pt", "en"]
    assert locale_candidates("pt_BR", "en-US") == ["pt-BR", "pt", "en-US", "en"]
    assert locale_candidates("zh-Hant-TW", "en") == ["zh-Hant-TW", "zh-Hant", "zh", "en"]
    assert locale_candidates(None, "de") == ["de"]
    assert locale_candidates("en-GB", "en") == ["en-GB", "en"]


async def test_locale_falls_back_from_region_to_language_to_tenant_default(engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine, default_locale="de")
    await add_template(engine, tenant, locale="de", body="de")
    await add_template(engine, tenant, locale="pt", body="pt")
    await add_template(engine, tenant, locale="pt-BR", body="pt-BR")

    def body(t: TemplateSource | None) -> str | None:
        return t.body if t else None

    assert body(await resolve(engine, tenant, locale="pt-BR", default_locale="de")) == "pt-BR"
    assert body(await resolve(engine, tenant, locale="pt-PT", default_locale="de")) == "pt"
    assert body(await resolve(engine, tenant, locale="pt_br", default_locale="de")) == "pt-BR"
    assert body(await resolve(engine, tenant, locale="fr-FR", default_locale="de")) == "de"
    assert body(await resolve(engine, tenant, locale=None, default_locale="de")) == "de"
    assert await resolve(engine, tenant, locale="fr", default_locale="en") is None


async def test_active_version_is_returned_unless_a_version_is_pinned(engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine)
    await add_template(engine, tenant, version=1, active=False, body="v1")
    await add_template(engine, tenant, version=2, active=True, body="v2")
    await add_template(engine, tenant, version=3, active=False, body="v3 draft")

    active = await resolve(engine, tenant, locale="en")
    assert active is not None
    assert (active.version, active.body, active.locale, active.active) == (2, "v2", "en", True)
    pinned = await resolve(engine, tenant, locale="en", version=1)
    assert pinned is not None and (pinned.version, pinned.body) == (1, "v1")
    assert await resolve(engine, tenant, locale="en", version=9) is None


async def test_pinned_version_still_falls_back_by_locale(engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine)
    await add_template(engine, tenant, locale="en", version=2, body="en v2")
    await add_template(engine, tenant, locale="pt", version=1, body="pt v1")
    found = await resolve(engine, tenant, locale="pt-BR", version=2)
    assert found is not None and found.body == "en v2"


async def test_templates_are_per_tenant_and_channel(engine: AsyncEngine) -> None:
    tenant, other = await make_tenant(engine), await make_tenant(engine)
    await add_template(engine, other, body="other tenant")
    await add_template(engine, tenant, channel="sms", subject=None, body="sms")
    assert await resolve(engine, tenant, locale="en") is None
    found = await resolve(engine, tenant, channel="sms", locale="en")
    assert found is not None and found.body == "sms"


def test_shipped_defaults_cover_the_documented_templates() -> None:
    shipped = {(t["channel"], t["name"], t["locale"]) for t in load_default_templates()}
    assert {
        ("email", "order_shipped", "en"),
        ("email", "order_shipped", "pt"),
        ("email", "welcome", "en"),
        ("sms", "otp", "en"),
        ("sms", "order_shipped", "en"),
        ("push", "order_shipped", "en"),
    } <= shipped
    assert (DEFAULT_TEMPLATES_DIR / "README.md").is_file()


@pytest.mark.parametrize(
    "template", load_default_templates(), ids=lambda t: f"{t['channel']}-{t['name']}-{t['locale']}"
)
def test_every_default_renders_with_its_sample_data(template: dict[str, Any]) -> None:
    renderer = Renderer()
    renderer.check_syntax(subject=template["subject"], body=template["body"], html=template["html"])
    content = renderer.render(
        subject=template["subject"],
        body=template["body"],
        html=template["html"],
        data=template["sample_data"],
    )
    assert template["sample_data"], "every default documents its variables with sample data"
    assert content.body.strip()
    if template["channel"] in ("email", "push"):
        assert content.subject
    if template["channel"] == "email":
        assert content.html and "<html" in content.html


def test_order_shipped_email_subject_names_the_order() -> None:
    [template] = [
        t
        for t in load_default_templates()
        if (t["channel"], t["name"], t["locale"]) == ("email", "order_shipped", "en")
    ]
    assert template["subject"] == "Your order {{ order_id }} has shipped"
    content = Renderer().render(
        subject=template["subject"], body=template["body"], html=template["html"], data={"order_id": "123"}
    )
    assert content.subject == "Your order 123 has shipped"


async def test_install_default_templates_is_idempotent(engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine)
    shipped = load_default_templates()
    async with engine.begin() as conn:
        assert await install_default_templates(conn=conn, tenant_id=tenant) == len(shipped)
    async with engine.begin() as conn:
        assert await install_default_templates(conn=conn, tenant_id=tenant) == 0
    async with engine.connect() as conn:
        count = (
            await conn.execute(sa.select(sa.func.count()).where(_templates.c.tenant_id == tenant))
        ).scalar_one()
    assert count == len(shipped)

    found = await resolve(engine, tenant, name="order_shipped", channel="email", locale="pt-BR")
    assert found is not None and found.locale == "pt" and found.active and found.version == 1
    [sample] = [
        t["sample_data"]
        for t in shipped
        if (t["name"], t["channel"], t["locale"]) == ("order_shipped", "email", "pt")
    ]
    content = Renderer().render(subject=found.subject, body=found.body, html=found.html, data=sample or {})
    assert content.subject == "Seu pedido A-1042 foi enviado"
    push = await resolve(engine, tenant, name="order_shipped", channel="push", locale="en")
    assert push is not None and push.subject == "Order {{ order_id }} has shipped"


async def test_install_keeps_a_customized_template_active(engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine)
    await add_template(
        engine, tenant, name="otp", channel="sms", version=2, subject=None, body="Code: {{ code }}"
    )
    async with engine.begin() as conn:
        await install_default_templates(conn=conn, tenant_id=tenant)
    active = await resolve(engine, tenant, name="otp", channel="sms", locale="en")
    assert active is not None and (active.version, active.body) == (2, "Code: {{ code }}")
    shipped = await resolve(engine, tenant, name="otp", channel="sms", locale="en", version=1)
    assert shipped is not None and not shipped.active


def test_template_files_are_validated(tmp_path: Path) -> None:
    (tmp_path / "sms" / "otp").mkdir(parents=True)
    (tmp_path / "sms" / "otp" / "en.yaml").write_text("body: 'Code {{ code }}'\nhtml: '<b>no</b>'\n")
    with pytest.raises(TemplateFileError, match="html"):
        load_default_templates(tmp_path)
    (tmp_path / "sms" / "otp" / "en.yaml").write_text("body: 'Code {{ code }}'\nversion: 3\n")
    [template] = load_default_templates(tmp_path)
    assert (template["name"], template["channel"], template["locale"], template["version"]) == (
        "otp",
        "sms",
        "en",
        3,
    )
    (tmp_path / "fax" / "otp").mkdir(parents=True)
    (tmp_path / "fax" / "otp" / "en.yaml").write_text("body: x\n")
    with pytest.raises(TemplateFileError, match="channel"):
        load_default_templates(tmp_path)
