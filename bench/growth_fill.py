"""A month of past notifications for ``bench.growth``: ``rows`` notifications spread evenly over the
30 days before today, one daily partition each, with what the log keeps beside them.

Per notification, as the pipeline writes them (``bench.e2e``'s welcome email): its event-id key,
its history, its delivery attempts and, for about one in four sent, a provider ``delivered`` event
(``engagement``), plus the day's hourly rollups. Statuses: 95% ``sent`` (one in 50 after a
transient first attempt), 2% ``failed`` (a transient then a permanent attempt), 3% ``suppressed``
(``opted_out``, no attempt). The provider is SendGrid's, so ``sandbox_messages`` gets its days but
no rows: only sandbox tenants write there, and at ~800 bytes a row it would double the log. The
tenant's 5,000 users are ``bench.load``'s (``u-0`` .. ``u-4999``), so the load's sends reuse them.

Each day of each table is filled in SQL (``INSERT ... SELECT generate_series``) into a plain table
without indexes, then attached as the day's partition: ``ATTACH PARTITION`` builds the parent's
indexes and checks its foreign keys once over the whole day instead of row by row, and the
schema's migrations are left as they are. The event-id keys are partitioned by the week, as the
upkeep makes them (``KEY_SPAN_DAYS``): their table gathers a week's days and is attached whole.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import asyncpg

from clarion.log_maintenance import KEY_SPAN_DAYS, LOG_TABLES, log_size
from schema.partition_ranges import DayRange, free_range
from schema.partitions import ensure_ahead, existing_ranges, partition_name

DAYS = 30
USERS = 5000
_DAY = dt.timedelta(days=1)

# $1 tenant, $2 the day's first instant, $3 rows, $4 seconds between two rows. A UUIDv7 carrying
# the row's time (schema.ids.created_window finds it by id); statuses by g % 100.
_NOTIFICATIONS = """
INSERT INTO {t} (id, tenant_id, event_id, request_hash, user_id, channel, category, priority,
                 template, template_version, locale, data, status, attempts, provider,
                 provider_message_id, error_code, error_message, history, published_at,
                 created_at, updated_at)
SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3)
        || '8' || substr(h, 4, 15))::uuid,
       $1::text, 'fill-' || to_char($2::timestamptz, 'YYYYMMDD') || '-' || g, h || md5(h),
       md5($1::text || '/u-' || g % {users})::uuid, 'email', 'general', 'normal', 'welcome', 1, 'en',
       jsonb_build_object('name', 'n' || g), status,
       CASE status WHEN 'suppressed' THEN 0 WHEN 'failed' THEN 2 ELSE 1 + (g % 50 = 7)::int END,
       CASE WHEN status <> 'suppressed' THEN 'sendgrid' END,
       CASE WHEN status = 'sent' THEN 'sg-' || substr(h, 9, 22) END,
       CASE status WHEN 'failed' THEN 'http_400' WHEN 'suppressed' THEN 'opted_out' END,
       CASE status WHEN 'failed' THEN 'The to address is not valid'
                   WHEN 'suppressed' THEN 'the user opted out of email in category ''general'' (user)' END,
       jsonb_build_array(
         jsonb_build_object('at', at, 'detail', NULL, 'status', 'accepted'),
         jsonb_build_object('at', at + interval '100 ms', 'detail', NULL, 'status', 'queued'))
       || CASE status
            WHEN 'suppressed' THEN jsonb_build_array(jsonb_build_object(
              'at', at + interval '1 s', 'detail', 'opted_out: user', 'status', 'suppressed'))
            WHEN 'failed' THEN jsonb_build_array(
              jsonb_build_object('at', at + interval '1 s', 'detail', NULL, 'status', 'sending'),
              jsonb_build_object('at', at + interval '2 s', 'detail', 'http_503', 'status', 'retrying'),
              jsonb_build_object('at', at + interval '3 s', 'detail', NULL, 'status', 'sending'),
              jsonb_build_object('at', at + interval '4 s', 'detail', 'http_400', 'status', 'failed'))
            ELSE jsonb_build_array(
              jsonb_build_object('at', at + interval '1 s', 'detail', NULL, 'status', 'sending'),
              jsonb_build_object('at', at + interval '2 s', 'detail', NULL, 'status', 'sent'))
          END,
       at + interval '100 ms', at, at + interval '4 s'
  FROM (SELECT g, $2::timestamptz + g * $4::float8 * interval '1 s' AS at,
               md5(to_char($2::timestamptz, 'YYYYMMDD') || '/' || g) AS h,
               CASE WHEN g % 100 < 2 THEN 'failed' WHEN g % 100 < 5 THEN 'suppressed' ELSE 'sent' END AS status
          FROM generate_series(0, $3 - 1) AS g) AS s
"""
_KEYS = """
INSERT INTO {t} (tenant_id, event_id, day, notification_id, request_hash)
SELECT tenant_id, event_id, (created_at AT TIME ZONE 'UTC')::date, id, request_hash FROM {n}
"""
_ATTEMPTS = """
INSERT INTO {t} (notification_id, attempt, provider, recipient, started_at, finished_at, outcome,
                 error_code, error_message, http_status, provider_message_id)
SELECT n.id, a, 'sendgrid', u.email, n.created_at + a * interval '1 s',
       n.created_at + a * interval '1 s' + interval '40 ms',
       CASE WHEN a < n.attempts THEN 'transient' WHEN n.status = 'sent' THEN 'sent' ELSE 'permanent' END,
       CASE WHEN a < n.attempts THEN 'http_503' WHEN n.status = 'failed' THEN 'http_400' END,
       CASE WHEN a < n.attempts THEN 'Service Unavailable' WHEN n.status = 'failed' THEN n.error_message END,
       CASE WHEN a < n.attempts THEN 503 WHEN n.status = 'failed' THEN 400 ELSE 202 END,
       CASE WHEN a = n.attempts THEN n.provider_message_id END
  FROM {n} AS n JOIN users AS u ON u.id = n.user_id, generate_series(1, n.attempts) AS a
"""
_DELIVERED = "n.status = 'sent' AND n.request_hash < '4'"  # about a quarter of the sent
_ENGAGEMENT = f"""
INSERT INTO {{t}} (notification_id, type, link, tenant_id, notification_created_at, first_at,
                   last_at, count, source, seen)
SELECT id, 'delivered', '', tenant_id, created_at, created_at + interval '6 s',
       created_at + interval '6 s', 1, 'sendgrid', ARRAY[substr(request_hash, 33, 22)]
  FROM {{n}} AS n WHERE {_DELIVERED}
"""
_ROLLUPS = f"""
INSERT INTO {{t}} (tenant_id, hour, channel, template, template_version, category, provider,
                   accepted, sent, failed, suppressed, delivered)
SELECT tenant_id, date_trunc('hour', created_at), channel, template, template_version, category,
       p.provider,
       CASE WHEN p.provider = '' THEN count(*) ELSE 0 END,
       CASE WHEN p.provider = '' THEN 0 ELSE count(*) FILTER (WHERE status = 'sent') END,
       CASE WHEN p.provider = '' THEN 0 ELSE count(*) FILTER (WHERE status = 'failed') END,
       CASE WHEN p.provider = '' THEN 0 ELSE count(*) FILTER (WHERE status = 'suppressed') END,
       CASE WHEN p.provider = '' THEN 0 ELSE count(*) FILTER (WHERE {_DELIVERED}) END
  FROM {{n}} AS n, (VALUES (''), ('sendgrid')) AS p(provider)
 GROUP BY 1, 2, 3, 4, 5, 6, 7
"""
# The tables filled from the day's notifications, in attach order (engagement's foreign key
# needs the notifications attached first); the keys' week is filled beside them (``_KeyWeek``).
_FROM_NOTIFICATIONS = {
    "delivery_attempts": _ATTEMPTS,
    "engagement": _ENGAGEMENT,
    "analytics_hourly": _ROLLUPS,
}


@dataclass(frozen=True, slots=True)
class Filled:
    """What a fill made and what it cost."""

    rows: int
    days: list[dt.date]
    fill_s: float
    vacuum_s: float
    log_bytes: int
    database_bytes: int


def day_rows(rows: int, days: int = DAYS) -> list[int]:
    """``rows`` spread over ``days`` days, the first days taking the remainder."""
    return [rows // days + (1 if i < rows % days else 0) for i in range(days)]


class _KeyWeek:
    """The keys' partition being filled: made at its first day, attached after its last."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.days: DayRange | None = None

    @property
    def name(self) -> str:
        assert self.days is not None
        return partition_name("notification_keys", self.days.start)

    async def holding(self, day: dt.date) -> str:
        """The table to fill ``day``'s keys into (a new one once ``day`` is past the last)."""
        if self.days is None or not self.days.covers(day):
            await self.attach()
            taken = [days for _, days in await existing_ranges(self.conn, parent="notification_keys")]
            self.days = free_range(day, span_days=KEY_SPAN_DAYS, taken=taken)
            await self.conn.execute(f"CREATE TABLE {self.name} (LIKE notification_keys INCLUDING DEFAULTS)")
        return self.name

    async def attach(self) -> None:
        if self.days is not None:
            await self.conn.execute(
                f"ALTER TABLE notification_keys ATTACH PARTITION {self.name} FOR VALUES {self.days.bounds()}"
            )
            self.days = None


async def _fill_day(
    conn: asyncpg.Connection, *, tenant_id: str, day: dt.date, rows: int, keys: _KeyWeek
) -> None:
    start = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    step_s = (86_400 - 10) / max(rows, 1)  # the last row's attempts still fall on its day
    names = {parent: partition_name(parent, day) for parent in ["notifications", *_FROM_NOTIFICATIONS]}
    for parent, name in names.items():
        await conn.execute(f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS)")
    n = names["notifications"]
    await conn.execute(_NOTIFICATIONS.format(t=n, users=USERS), tenant_id, start, rows, step_s)
    await conn.execute(_KEYS.format(t=await keys.holding(day), n=n))
    for parent, sql in _FROM_NOTIFICATIONS.items():
        await conn.execute(sql.format(t=names[parent], n=n))
    for parent, name in names.items():
        await conn.execute(
            f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES {DayRange(day, day + _DAY).bounds()}"
        )


async def fill(conn: asyncpg.Connection, *, tenant_id: str, rows: int, today: dt.date) -> Filled:
    """Fill the ``DAYS`` days before ``today`` with ``rows`` notifications of ``tenant_id`` (and
    create its ``USERS`` users), then ``VACUUM ANALYZE``; prints a line per day."""
    await conn.execute("SET TIME ZONE 'UTC'")
    await conn.execute(
        "INSERT INTO users (id, tenant_id, external_id, email, phone)"
        " SELECT md5($1::text || '/u-' || k)::uuid, $1::text, 'u-' || k, 'user' || k || '@example.com', '+14155550100'"
        " FROM generate_series(0, $2 - 1) AS k",
        tenant_id, USERS,
    )  # fmt: skip
    days = [today - (DAYS - i) * _DAY for i in range(DAYS)]
    started = time.perf_counter()
    keys = _KeyWeek(conn)
    for day, count in zip(days, day_rows(rows), strict=True):
        t0 = time.perf_counter()
        await _fill_day(conn, tenant_id=tenant_id, day=day, rows=count, keys=keys)
        print(f"  filled {day}: {count:,} notifications in {time.perf_counter() - t0:.1f} s", flush=True)
    await keys.attach()
    for table in LOG_TABLES:  # the days of the tables not filled (sandbox_messages): empty
        await ensure_ahead(
            conn, parent=table.name, today=days[0], days_ahead=DAYS - 1, span_days=table.span_days
        )
    fill_s = time.perf_counter() - started
    started = time.perf_counter()
    await conn.execute(f"VACUUM ANALYZE users, {', '.join(t.name for t in LOG_TABLES)}")
    vacuum_s = time.perf_counter() - started
    size = await log_size(conn=conn, today=today)
    database_bytes = await conn.fetchval("SELECT pg_database_size(current_database())")
    return Filled(rows, days, fill_s, vacuum_s, size.total_bytes, int(database_bytes))
