"""The preferences screen: a notification the user does not want is ``suppressed`` before it is
rendered; the resolution order is ``core.preferences.decide``."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from clarion.tokens import make_token
from core.preferences import ANY, CategoryRule, decide
from schema.enums import Status
from workers.claim import ClaimedNotification
from workers.outcome import Outcome


async def load_rules(
    *, pool: asyncpg.Pool, pairs: set[tuple[str, str]]
) -> dict[tuple[str, str], CategoryRule]:
    """The declared categories among (tenant, category) ``pairs``, in one query."""
    if not pairs:
        return {}
    tenants, names = zip(*sorted(pairs), strict=True)
    rows = await pool.fetch(
        "SELECT c.tenant_id, c.name, c.default_opted_in, c.required, c.email_quiet_hours"
        "  FROM categories c JOIN unnest($1::text[], $2::text[]) AS p(tenant_id, name)"
        "    ON c.tenant_id = p.tenant_id AND c.name = p.name",
        list(tenants),
        list(names),
    )
    return {
        (r["tenant_id"], r["name"]): CategoryRule(
            r["default_opted_in"], r["required"], r["email_quiet_hours"]
        )
        for r in rows
    }


class PreferencesScreen:
    """Suppresses notifications the user opted out of (status ``suppressed``, code ``opted_out``).

    Also builds the one-click unsubscribe URL for email (:meth:`unsubscribe_url`): none for a
    required category, which cannot be unsubscribed from.
    """

    name = "preferences"
    _MAX_REMEMBERED = 10_000

    def __init__(self, *, pool: asyncpg.Pool, secret: str, base_url: str, token_ttl_s: float) -> None:
        self.pool = pool
        self.secret = secret
        self.base_url = base_url.rstrip("/")
        self.token_ttl_s = token_ttl_s
        self._required: dict[tuple[str, str], bool] = {}

    async def screen(self, rows: list[ClaimedNotification]) -> dict[UUID, Outcome]:
        """Outcomes ``suppressed`` for opted-out notifications; every other id goes on."""
        rules = await load_rules(pool=self.pool, pairs={(r.tenant_id, r.category) for r in rows})
        if len(self._required) > self._MAX_REMEMBERED:
            self._required.clear()
        for r in rows:
            rule = rules.get((r.tenant_id, r.category))
            self._required[(r.tenant_id, r.category)] = bool(rule and rule.required)
        prefs: dict[UUID, dict[tuple[str, str], bool]] = {}
        for p in await self.pool.fetch(
            "SELECT user_id, channel, category, opted_in FROM preferences"
            " WHERE user_id = ANY($1::uuid[]) AND category = ANY($2::text[])",
            list({r.user_id for r in rows}),
            [*{r.category for r in rows}, ANY],
        ):
            prefs.setdefault(p["user_id"], {})[(p["channel"], p["category"])] = p["opted_in"]
        stopped: dict[UUID, Outcome] = {}
        for r in rows:
            decision = decide(
                prefs=prefs.get(r.user_id, {}),
                channel=r.channel,
                category=r.category,
                rule=rules.get((r.tenant_id, r.category)),
            )
            if not decision.opted_in:
                stopped[r.id] = Outcome(
                    notification_id=r.id,
                    status=Status.suppressed,
                    error_code="opted_out",
                    error_message=(
                        f"the user opted out of {r.channel} in category '{r.category}' ({decision.source})"
                    ),
                    detail=f"opted_out: {decision.source}",
                )
        return stopped

    def unsubscribe_url(self, row: ClaimedNotification) -> str | None:
        """``{base_url}/v1/unsubscribe?token=...`` for the row's user and category, or None when the
        category is required."""
        if self._required.get((row.tenant_id, row.category), False):
            return None
        token = make_token(
            secret=self.secret,
            tenant_id=row.tenant_id,
            user_id=row.user_id,
            purpose="unsubscribe",
            category=row.category,
            ttl_s=self.token_ttl_s,
        )
        return f"{self.base_url}/v1/unsubscribe?token={token}"
