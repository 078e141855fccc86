"""``clarion webhooks``: sends the tenants' webhook deliveries, as many at once as allowed.

The story of one delivery: claim (``webhook_claim``: leased, counted) -> the endpoint's breaker
(open: defer without a call) -> call (``webhook_send``: SSRF check on the resolved addresses,
signed, bounded) -> breaker counts the result -> record (``webhook_record``: delivered, retry
with backoff, given up, endpoint disabled after a long streak). Each result is recorded as its
call ends, not per batch, so a process killed mid-delivery leaves only its in-flight calls to be
sent again after their lease.

Its own process role rather than a task of the relay: tenants' servers are slow and hostile
(timeouts, drip-fed answers), the relay's pass must stay short for Kafka, and the two scale apart.
Breakers live in the process (as the providers' do): several processes judge an endpoint apart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import Counter
from dataclasses import dataclass
from functools import partial

import asyncpg
import httpx

from clarion import metrics
from clarion.retry_settings import BreakerSettings
from core import ssrf
from core.dns import Resolver
from workers.breaker import CircuitBreaker, CircuitOpen
from workers.record import until_done
from workers.webhook_claim import ClaimedDelivery, claim
from workers.webhook_record import RetryPolicy, record_deferred, record_result
from workers.webhook_retention import maintain, make_days
from workers.webhook_send import call, new_client

log = logging.getLogger(__name__)
MAINTAIN_EVERY_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverySettings:
    concurrency: int
    per_tenant: int  # of ``concurrency``, what one tenant's deliveries may hold (webhook_claim)
    lease_s: float
    timeout_s: float
    poll_interval_s: float
    retention_days: int
    allow: ssrf.AllowList
    policy: RetryPolicy
    breaker: BreakerSettings


class WebhookDeliverer:
    """Claims and sends until stopped; ``run`` returns only when cancelled."""

    def __init__(self, *, pool: asyncpg.Pool, settings: DeliverySettings) -> None:
        self.pool = pool
        self.settings = settings
        self.client: httpx.AsyncClient = new_client()
        self._breakers: dict[str, CircuitBreaker] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        self._calls: Counter[str] = Counter()  # calls in flight per tenant
        # Four times the calls: room for every call's lookup while some tenants' hang (at most
        # per_tenant each, two per host, counted until their threads are done; core/dns.py).
        self.resolver = Resolver(threads=4 * settings.concurrency, per_key=settings.per_tenant, per_host=2)

    async def run(self) -> None:
        await self._make_days()
        maintainer = asyncio.create_task(self._maintain_hourly())
        try:
            while True:
                free = self.settings.concurrency - len(self._inflight)
                claimed: list[ClaimedDelivery] = []
                if free > 0:
                    try:
                        claimed = await claim(
                            pool=self.pool,
                            limit=free,
                            lease_s=self.settings.lease_s,
                            per_tenant=self.settings.per_tenant,
                            busy=self._calls,
                        )
                    except Exception as exc:  # database away: try again after the pause
                        log.warning("webhook claim failed (%s: %s)", type(exc).__name__, exc)
                for delivery in claimed:
                    self._calls[delivery.tenant_id] += 1
                    task = asyncio.create_task(self._deliver(delivery))
                    self._inflight.add(task)
                    task.add_done_callback(self._inflight.discard)
                    task.add_done_callback(partial(self._done, delivery.tenant_id))
                if claimed and len(self._inflight) < self.settings.concurrency:
                    continue  # more may be due: claim again at once
                if self._inflight:
                    await asyncio.wait(
                        self._inflight,
                        timeout=self.settings.poll_interval_s,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                else:
                    await asyncio.sleep(self.settings.poll_interval_s)
        finally:
            maintainer.cancel()
            await self.stop()

    def _done(self, tenant_id: str, _task: asyncio.Task[None]) -> None:
        self._calls[tenant_id] -= 1
        if not self._calls[tenant_id]:
            del self._calls[tenant_id]

    async def stop(self, drain_s: float = 5.0) -> None:
        """Let calls in flight finish for up to ``drain_s``, cancel the rest (their lease brings
        them back), close the client."""
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=drain_s)
        for task in list(self._inflight):
            task.cancel()
        await self.client.aclose()
        self.resolver.close()

    def breaker_for(self, endpoint_id: str) -> CircuitBreaker | None:
        if not self.settings.breaker.enabled:
            return None
        breaker = self._breakers.get(endpoint_id)
        if breaker is None:
            breaker = self._breakers[endpoint_id] = CircuitBreaker(
                f"webhook:{endpoint_id}", self.settings.breaker, export=False
            )
        return breaker

    async def _deliver(self, delivery: ClaimedDelivery) -> None:
        breaker = self.breaker_for(str(delivery.endpoint_id))
        try:
            if breaker is not None:
                breaker.check()
        except CircuitOpen as refused:
            until = refused.until
            metrics.WEBHOOK_CALLS.labels("deferred").inc()
            await until_done(
                "deferred", lambda: record_deferred(pool=self.pool, delivery=delivery, until=until)
            )
            return
        result = await call(
            client=self.client,
            delivery=delivery,
            allow=self.settings.allow,
            timeout_s=self.settings.timeout_s,
            resolver=self.resolver,
        )
        if breaker is not None and not result.refused:
            breaker.record(failed=not result.ok)
        metrics.WEBHOOK_CALLS.labels(
            "delivered" if result.ok else "refused" if result.refused else "failed"
        ).inc()
        disabled = await until_done(
            "recorded",
            lambda: record_result(
                pool=self.pool, delivery=delivery, result=result, policy=self.settings.policy
            ),
        )
        if disabled:
            metrics.WEBHOOK_ENDPOINTS_DISABLED.inc()
            log.warning("webhook endpoint %s disabled after its failure streak", delivery.endpoint_id)

    async def _make_days(self) -> None:
        """Today's and tomorrow's partitions before the first claim (``webhook_retention``: none of
        the deliveries this process sends is then moved out of a default partition under it)."""
        try:
            await make_days(pool=self.pool, today=dt.datetime.now(dt.UTC).date())
        except Exception as exc:  # the database away, the default held by a long reader: claim anyway
            log.warning(
                "webhook partitions not made before the first claim (%s: %s)", type(exc).__name__, exc
            )

    async def _maintain_hourly(self) -> None:
        while True:
            try:
                await maintain(
                    pool=self.pool,
                    today=dt.datetime.now(dt.UTC).date(),
                    retention_days=self.settings.retention_days,
                )
            except Exception as exc:
                log.warning("webhook partition upkeep failed (%s: %s)", type(exc).__name__, exc)
            await asyncio.sleep(MAINTAIN_EVERY_S)
