"""How much of the API's database pool the providers' status callbacks may hold: Twilio's status
callbacks (``api.webhooks``) and SendGrid's Event Webhook batches (``api.sendgrid_events``).

They carry no API key and name no tenant before the database says whose notification they are
about, and a Twilio callback carries no timestamp: one captured (a proxy's log) verifies forever,
so anyone holding one can replay it in a loop. Before (2026-11-29, ``python -m
bench.provider_callbacks``, 40 loops in a process of their own, two runs): every callback took a
pooled connection and then waited on its notification's row lock (``FOR UPDATE``), and the loops
took the pool; another tenant's accept p99 under 40 loops of a keyed ``GET /v1/users/{id}`` (the
control) was 43 and 261 ms, and 451 and 294 ms under one replayed Twilio callback, 7.2 and 9.6 s
(2 accepts in 6 s) under a batch of 200 SendGrid events about one email, 7.1 and 5.8 s under one
of 2,000 events about 2,000 emails.

So, after the signature is verified and before a connection is taken:

- a Twilio callback takes a turn of its message sid: one per sid at once in one API process, and
  at most a quarter of the pool for all of them (``api.tenant_turns``, keyed by sid, not by
  tenant); it waits up to ``TWILIO_WAIT_S`` (Twilio retries a refused callback only when its URL
  asks it to, with a connection override, so a burst of real ones queues), and a repeat of a
  report already recorded is one read, with no lock;
- a SendGrid batch takes one of ``SENDGRID_AT_ONCE`` turns (a quarter of the pool at most),
  waiting up to ``SENDGRID_WAIT_S``: SendGrid retries a refused batch, and a retried one is
  recorded once (its events' ``sg_event_id``);
- each then waits at most ``LOCK_TIMEOUT_MS`` for a notification's row.

Past either: ``429 callback_busy`` with ``Retry-After: 1``, nothing changed (but the chunks of a
SendGrid batch recorded before the row it waited for: ``api.sendgrid_events``). After, the same probe
(two runs, the control 254 and 141 ms): 35 and 21 ms under the Twilio replays (all answered, 439 and
717 a second), 47 and 23 ms under the batches about one email, 221 and 111 ms under the wide ones
(about half of the batches refused as busy: a first wide batch is 2,000 engagement upserts, a
statement each). Since 2026-11-29 (later) a chunk's engagement is a few statements (``core.engagement``)
and a batch takes its turn before it is parsed (``api.sendgrid_events``): the other tenant's p99
under the batches about one email 43-73 ms, all answered (64-145 a second; five runs), and under
the wide ones 102-208 ms, a quarter to two fifths refused as busy (six runs; the control 49-133 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ApiError
from api.tenant_turns import TenantTurns

TWILIO_WAIT_S = 5.0
SENDGRID_AT_ONCE = 2
SENDGRID_WAIT_S = 2.0
LOCK_TIMEOUT_MS = 1000
SENDGRID = "sendgrid"  # the one key of SendGrid's turns: a batch is about many tenants


@dataclass(frozen=True, slots=True)
class CallbackGate:
    """Per-process turns of the provider callbacks; lives on ``app.state.callback_gate``."""

    twilio: TenantTurns  # keyed by message sid
    sendgrid: TenantTurns  # keyed by ``SENDGRID``

    @staticmethod
    def build(
        *, pool_size: int, twilio_wait_s: float = TWILIO_WAIT_S, sendgrid_wait_s: float = SENDGRID_WAIT_S
    ) -> CallbackGate:
        # TenantTurns lets all keys together hold half the pool_size it is given: a quarter each.
        share = max(2, pool_size // 2)
        return CallbackGate(
            twilio=TenantTurns(pool_size=share, per_tenant=1, wait_s=twilio_wait_s),
            sendgrid=TenantTurns(pool_size=share, per_tenant=SENDGRID_AT_ONCE, wait_s=sendgrid_wait_s),
        )


def callback_busy() -> ApiError:
    return ApiError(
        429,
        "callback_busy",
        "Status callbacks already hold their share of the database; retry after Retry-After.",
        headers={"Retry-After": "1"},
    )
