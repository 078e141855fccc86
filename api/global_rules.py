"""The operator's rate-limit rules: ``rate_limit_rules`` rows without a tenant, which apply to every
tenant (``clarion limits``, ``commands/limits_cli.py``).

A ``tenant`` rule set here is each tenant's own budget at the API: every tenant gets ``limit`` sends
per ``period_s`` (its key names the tenant, ``api/ingress.py``), so no tenant can fill the shared
lanes faster than the operator allows while another waits behind its backlog. A ``provider`` rule
paces a provider account for every tenant. Tenants cannot see, change or delete these rules
(``api/rate_limits.py`` serves only their own); running processes pick a change up within
``clarion.rules.REFRESH_TTL_S`` seconds.

A global rule is named, and its name is how ``set`` finds it again: setting a name that exists
replaces that rule (its limiter state carries over).

Errors: ``ValueError`` for a rule without a name, or an elastic one (an elastic cap borrows from
the provider pacing of one tenant's sends: set it per tenant).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.caps import one_at_a_time
from api.rate_limits import RateLimitIn, RateLimitOut
from schema.models import RateLimitRule

_rules = RateLimitRule.__table__  # type: ignore[attr-defined]
_GLOBAL = _rules.c.tenant_id.is_(None)


async def list_global_rules(*, engine: AsyncEngine) -> list[RateLimitOut]:
    """Every global rule, oldest first (enabled or not)."""
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(_rules).where(_GLOBAL).order_by(_rules.c.created_at))).all()
    return [RateLimitOut.model_validate(r, from_attributes=True) for r in rows]


async def set_global_rule(*, engine: AsyncEngine, rule: RateLimitIn) -> tuple[RateLimitOut, bool]:
    """Store ``rule`` under its name, replacing a global rule of that name; returns it and whether
    it is new. Two operators setting one name at once are serialised on the name."""
    if not rule.name:
        raise ValueError("a global rule needs a name: it is how `clarion limits set` finds it again")
    if rule.mode == "elastic":
        raise ValueError("an elastic cap borrows one tenant's provider pacing: set it as that tenant's rule")
    values = rule.model_dump()
    values["channel"] = rule.channel.value if rule.channel is not None else None
    async with engine.begin() as conn:
        await one_at_a_time(conn, kind="global-rule", key=rule.name)
        row = (
            await conn.execute(
                _rules.update()
                .where(_GLOBAL, _rules.c.name == rule.name)
                .values(**values, updated_at=sa.func.now())
                .returning(_rules)
            )
        ).first()
        created = row is None
        if row is None:
            row = (
                await conn.execute(_rules.insert().values(tenant_id=None, **values).returning(_rules))
            ).one()
    return RateLimitOut.model_validate(row, from_attributes=True), created


async def delete_global_rule(*, engine: AsyncEngine, name: str) -> bool:
    """Delete the global rule named ``name``; whether there was one."""
    async with engine.begin() as conn:
        result = await conn.execute(_rules.delete().where(_GLOBAL, _rules.c.name == name))
    return bool(result.rowcount)
