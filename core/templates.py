"""Template lookup (with locale fallback and versions) and the defaults shipped in ``templates/``.

The shipped defaults live outside the Python packages, in the repository's ``templates/`` folder, one
YAML file per template: ``templates/<channel>/<name>/<locale>.yaml`` (see ``templates/README.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa
import yaml
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from schema.enums import Channel
from schema.ids import uuid7
from schema.models import Template

DEFAULT_TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"

_templates = Template.__table__  # type: ignore[attr-defined]

# Which keys a template file may carry, per channel; ``title`` is a push notification's subject.
_ALLOWED_KEYS: dict[Channel, frozenset[str]] = {
    Channel.email: frozenset({"subject", "body", "html", "sample_data", "version", "description"}),
    Channel.push: frozenset({"title", "body", "sample_data", "version", "description"}),
    Channel.sms: frozenset({"body", "sample_data", "version", "description"}),
}


class TemplateFileError(ValueError):
    """A shipped template file is malformed; the message names the file."""


def locale_candidates(locale: str | None, default_locale: str = "en") -> list[str]:
    """The locales to try, best first: ``pt-BR`` -> ``pt`` -> the default locale (and its language).

    Separators are normalized (``pt_BR`` is ``pt-BR``); duplicates are dropped.
    """
    candidates: list[str] = []
    for wanted in (locale, default_locale):
        if not wanted:
            continue
        tag = wanted.strip().replace("_", "-")
        subtags = tag.split("-")
        for n in range(len(subtags), 0, -1):
            candidate = "-".join(subtags[:n])
            if candidate and candidate.lower() not in {c.lower() for c in candidates}:
                candidates.append(candidate)
    return candidates


_RESOLVE_SQL = """
SELECT locale, version, active, subject, body, html, track_email FROM templates
 WHERE tenant_id = $1 AND name = $2 AND channel = $3 AND lower(locale) = ANY($4::text[])
   AND (CASE WHEN $5::int IS NULL THEN active ELSE version = $5::int END)
"""


@dataclass(frozen=True, slots=True)
class TemplateSource:
    """What rendering needs of a template row (cheap to build on the hot path)."""

    locale: str
    version: int
    active: bool
    subject: str | None
    body: str
    html: str | None
    track_email: bool | None = None  # Clarion's email tracking: None follows the tenant


async def resolve_template(
    *,
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant_id: str,
    name: str,
    channel: str,
    locale: str | None,
    version: int | None = None,
    default_locale: str = "en",
) -> TemplateSource | None:
    """The tenant's template ``name`` for ``channel`` in the best available locale, or None.

    Locales are tried as :func:`locale_candidates` orders them (case-insensitively). Without ``version``
    the active version is returned (the highest, should several be active); with it, exactly that
    version, active or not. One query; the one lookup of the API (accept, preview) and the workers.
    """
    candidates = locale_candidates(locale, default_locale)
    rank = {candidate.lower(): i for i, candidate in enumerate(candidates)}
    rows = await conn.fetch(_RESOLVE_SQL, tenant_id, name, str(channel), list(rank), version)
    best = _best(rows, rank)
    return TemplateSource(**best) if best is not None else None


def _best(rows: Sequence[Mapping[str, Any]], rank: dict[str, int]) -> dict[str, Any] | None:
    if not rows:
        return None
    return dict(min(rows, key=lambda row: (rank[row["locale"].lower()], -row["version"])))


def load_default_templates(path: Path | None = None) -> list[dict[str, Any]]:
    """Read the shipped templates (``templates/`` in the repository, or ``path``).

    Each dict has ``name``, ``channel``, ``locale``, ``version``, ``subject`` (email subject or push
    title), ``body``, ``html`` and ``sample_data``: the columns of a ``templates`` row. Sorted by
    (channel, name, locale). Raises :class:`TemplateFileError` for a malformed file.
    """
    root = path or DEFAULT_TEMPLATES_DIR
    loaded: list[dict[str, Any]] = []
    for file in sorted(root.glob("*/*/*.yaml")):
        locale, name, channel_dir = file.stem, file.parent.name, file.parent.parent.name
        try:
            channel = Channel(channel_dir)
        except ValueError:
            raise TemplateFileError(f"{file}: unknown channel folder {channel_dir!r}") from None
        content = yaml.safe_load(file.read_text(encoding="utf-8"))
        if not isinstance(content, dict):
            raise TemplateFileError(f"{file}: expected a mapping of keys to values")
        unknown = set(content) - _ALLOWED_KEYS[channel]
        if unknown:
            raise TemplateFileError(f"{file}: keys not allowed for {channel.value}: {sorted(unknown)}")
        if not isinstance(content.get("body"), str) or not content["body"].strip():
            raise TemplateFileError(f"{file}: 'body' is required")
        if channel is Channel.email and not content.get("subject"):
            raise TemplateFileError(f"{file}: an email template needs a 'subject'")
        loaded.append(
            {
                "name": name,
                "channel": channel.value,
                "locale": locale,
                "version": int(content.get("version", 1)),
                "subject": content.get("subject", content.get("title")),
                "body": content["body"],
                "html": content.get("html"),
                "sample_data": content.get("sample_data") or {},
            }
        )
    return loaded


async def install_default_templates(
    *, conn: AsyncConnection | AsyncSession, tenant_id: str, path: Path | None = None
) -> int:
    """Copy the shipped templates to a tenant; returns how many rows were inserted.

    Idempotent: a (name, channel, locale, version) the tenant already has is skipped, also under
    concurrent installs. A default is installed inactive when the tenant already has an active
    version of that (name, channel, locale), so a customized template stays the one in use.
    The caller owns the transaction.
    """
    defaults = load_default_templates(path)
    if not defaults:
        return 0
    connection = await conn.connection() if isinstance(conn, AsyncSession) else conn
    existing = (
        await connection.execute(
            sa.select(
                _templates.c.name, _templates.c.channel, _templates.c.locale, _templates.c.version
            ).where(_templates.c.tenant_id == tenant_id, _templates.c.active.is_(True))
        )
    ).all()
    has_active = {(row.name, row.channel, row.locale) for row in existing}
    rows = [
        {
            **template,
            "id": uuid7(),
            "tenant_id": tenant_id,
            "active": (template["name"], template["channel"], template["locale"]) not in has_active,
        }
        for template in defaults
    ]
    inserted = await connection.execute(
        insert(_templates)
        .values(rows)
        .on_conflict_do_nothing(constraint="uq_templates_version")
        .returning(_templates.c.id)
    )
    return len(inserted.all())
