"""Listing a tenant's template versions a page at a time.

Every version is kept (up to ``CLARION_MAX_TEMPLATES_PER_TENANT``, 500) and each may hold 64 KB of
text, so the whole list was one answer of up to ~30 MB: a helper's probe (2026-11-28) made it
30.7 MB, built on the API's event loop in 0.4 s, and sixteen such reads at once took another
tenant's accept p99 from 24 ms to 1.9 s and the API to 1.1 GB. A page holds at most ``MAX_PAGE``
versions (3.2 MB at the most), in the order name, channel, locale, newest version first; the
answer stays a JSON array and, when more remain, says where the next page is in a ``Link`` header
(``rel="next"``, RFC 8288), as GitHub's API does. The cursor is the last version's key, opaque to
the caller.

Errors (``ApiError``)::

    422 invalid_cursor  a cursor this API did not issue
"""

from __future__ import annotations

import base64
import binascii
import json
from urllib.parse import urlencode

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.errors import ApiError
from api.templates_service import TemplateOut, template_out
from schema.enums import Channel
from schema.models import Template

MAX_PAGE = 50
_templates = Template.__table__  # type: ignore[attr-defined]
_Key = tuple[str, str, str, int]  # name, channel, locale, version


def encode_cursor(key: _Key) -> str:
    return (
        base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")
    )


def decode_cursor(cursor: str) -> _Key:
    """The key a cursor names; ``ApiError`` 422 for anything this API did not issue."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        name, channel, locale, version = raw
        texts = (name, channel, locale)
        if not (all(isinstance(s, str) for s in texts) and type(version) is int and 0 < version < 2**31):
            raise ValueError(raw)
        for text in texts:  # what the database could not compare: a NUL, a lone surrogate
            if "\x00" in text or len(text) > 128:
                raise ValueError(raw)
            text.encode()
        return name, channel, locale, version
    except (ValueError, TypeError, binascii.Error, UnicodeError) as exc:
        raise ApiError(
            422, "invalid_cursor", "The cursor is not one this API issued; start again without it."
        ) from exc


async def list_templates(
    *,
    engine: AsyncEngine,
    tenant_id: str,
    name: str | None = None,
    channel: Channel | None = None,
    cursor: str | None = None,
    limit: int = MAX_PAGE,
) -> tuple[list[TemplateOut], str | None]:
    """One page of the tenant's template versions (optionally of one name / channel) after
    ``cursor``, and the cursor of the next page (None on the last)."""
    t = _templates
    query = sa.select(t).where(t.c.tenant_id == tenant_id)
    if name is not None:
        query = query.where(t.c.name == name)
    if channel is not None:
        query = query.where(t.c.channel == channel.value)
    if cursor is not None:
        n, c, loc, version = decode_cursor(cursor)
        group, after = sa.tuple_(t.c.name, t.c.channel, t.c.locale), sa.tuple_(n, c, loc)
        query = query.where(sa.or_(group > after, sa.and_(group == after, t.c.version < version)))
    query = query.order_by(t.c.name, t.c.channel, t.c.locale, t.c.version.desc()).limit(limit + 1)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    more, rows = len(rows) > limit, rows[:limit]
    last = rows[-1] if rows else None
    return [template_out(r) for r in rows], (
        encode_cursor((last.name, last.channel, last.locale, last.version)) if more and last else None
    )


def next_link(path: str, *, cursor: str | None, limit: int, channel: Channel | None) -> dict[str, str]:
    """The ``Link`` header naming the next page, or no header on the last page."""
    if cursor is None:
        return {}
    query = {"cursor": cursor, "limit": limit} | ({"channel": channel.value} if channel else {})
    return {"Link": f'<{path}?{urlencode(query)}>; rel="next"'}
