"""Ingress rate limits: ``tenant`` and ``api_key`` rules, enforced on sends at the API.

A send over any matching rule is refused with ``429 rate_limited``, a ``Retry-After`` (whole
seconds, rounded up: a client that waits that long is admitted unless others consume the
budget meanwhile) and ``RateLimit-Limit/Remaining/Reset`` headers describing the rule that
refused it. An admitted send carries the same ``RateLimit-*`` headers for the matching rule with
the least remaining. A batch costs its size (`enforce_ingress` with ``cost=len(batch)``); a
batch larger than a rule admits at once is refused with ``422 batch_exceeds_rate_limit``.

Every API process decides against one store when ``CLARION_REDIS_URL`` is set (a limit is global
to the deployment); without Redis each process counts alone. A request refused by one rule still
counts against the other rules that admitted it.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError
from clarion import metrics
from clarion.rules import RulesCache, RuleSpec
from clarion.settings import Settings
from clarion.tenants import Principal
from core.limiter import build_rate_limiter
from core.ratelimit import Allowed, RateLimiter, RetryAfter, Rule, rate_limit_headers

HEADERS_STATE = "rate_limit_headers"


@dataclass
class IngressLimits:
    """What the API needs to enforce ingress rules; lives on ``app.state.ingress``."""

    rules: RulesCache
    limiter: RateLimiter

    @classmethod
    def build(cls, *, settings: Settings, pool: asyncpg.Pool) -> IngressLimits:
        return cls(
            RulesCache.from_pool(pool),
            build_rate_limiter(settings.redis_url, prefix=f"{settings.redis_key_prefix}rl:"),
        )

    async def aclose(self) -> None:
        await self.limiter.aclose()


def tenant_key(spec: RuleSpec, tenant_id: str) -> str:
    """The limiter key of a ``tenant`` rule for one tenant: its accepts and, when they come due,
    its scheduled sends' releases (`api.release_pacing`) are charged to it."""
    return f"ingress:{spec.id}:{tenant_id}"


def _key(spec: RuleSpec, principal: Principal) -> str:
    if spec.scope == "tenant":
        return tenant_key(spec, principal.tenant_id)
    return f"ingress:{spec.id}:{principal.tenant_id}:{principal.key_id}"


async def enforce_ingress(*, request: Request, principal: Principal, cost: int) -> None:
    """Charge ``cost`` sends to every ingress rule of the caller; raise ``ApiError(429)`` if any
    rule refuses, or ``ApiError(422, "batch_exceeds_rate_limit")`` if ``cost`` is more than a rule
    admits at once even when idle (waiting would never help: split the batch)."""
    ingress: IngressLimits = request.app.state.ingress
    snapshot = await ingress.rules.current()
    specs = [
        *snapshot.for_tenant("tenant", principal.tenant_id),
        *snapshot.for_tenant("api_key", principal.tenant_id),
    ]
    if not specs:
        return
    rules = [spec.to_rule() for spec in specs]
    for spec, rule in zip(specs, rules, strict=True):
        if cost > rule.capacity:
            raise ApiError(
                422,
                "batch_exceeds_rate_limit",
                f"{cost} sends at once exceed the {spec.scope} rate limit '{spec.label}', which admits at "
                f"most {rule.capacity} at once; split the batch.",
                {"rule": spec.label, "max_at_once": rule.capacity},
            )
    decisions = await ingress.limiter.acquire_many(
        [(_key(spec, principal), rule, cost) for spec, rule in zip(specs, rules, strict=True)]
    )
    refused: tuple[RuleSpec, Rule, RetryAfter] | None = None
    tightest: tuple[Rule, Allowed] | None = None
    for spec, rule, decision in zip(specs, rules, decisions, strict=True):
        if isinstance(decision, RetryAfter):
            metrics.RATELIMIT_DECISIONS.labels(spec.metric_label, "rejected").inc()
            if refused is None or decision.retry_after_ms > refused[2].retry_after_ms:
                refused = (spec, rule, decision)
        else:
            metrics.RATELIMIT_DECISIONS.labels(spec.metric_label, "allowed").inc()
            if tightest is None or decision.remaining < tightest[1].remaining:
                tightest = (rule, decision)
    if refused is not None:
        spec, rule, rejection = refused
        headers = rate_limit_headers(rule, rejection)
        raise ApiError(
            429,
            "rate_limited",
            f"Over the {spec.scope} rate limit '{spec.label}' ({spec.limit} per {spec.period_s:g}s); "
            f"retry after {headers['Retry-After']}s.",
            {"rule": spec.label, "scope": spec.scope, "retry_after_s": int(headers["Retry-After"])},
            headers=headers,
        )
    if tightest is not None:
        setattr(request.state, HEADERS_STATE, rate_limit_headers(*tightest))


class RateLimitHeaders:
    """Adds the ``RateLimit-*`` headers `enforce_ingress` decided to the response, whatever
    response object the route returns."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = scope.get("state", {}).get(HEADERS_STATE)
                if extra:
                    present = {k.lower() for k, _ in message.get("headers", [])}
                    message["headers"] = [
                        *message.get("headers", []),
                        *(
                            (k.lower().encode(), v.encode())
                            for k, v in extra.items()
                            if k.lower().encode() not in present
                        ),
                    ]
            await send(message)

        await self.app(scope, receive, with_headers)
