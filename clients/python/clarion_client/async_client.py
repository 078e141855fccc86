"""``AsyncClarion``: the API's operations over httpx, with ``await``; the same calls, retries and
errors as the synchronous ``clarion_client.client.Clarion``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import httpx

from clarion_client import _calls as calls
from clarion_client._core import (
    BATCH_SIZE,
    DEFAULT_URL,
    Call,
    Progress,
    chunks,
    headers,
    next_page,
    parse,
    progress_callback,
    raise_for,
    retry_after_s,
    should_retry,
    total_of,
)
from clarion_client.models import (
    Accepted,
    AnalyticsPage,
    AnalyticsRow,
    BatchResult,
    Cancelled,
    Device,
    DeviceOut,
    EngagementRecorded,
    EngagementReport,
    NotificationStatus,
    Preference,
    Preferences,
    Preview,
    PreviewIn,
    Template,
    TemplateIn,
    User,
    UserProfile,
)


class AsyncClarion:
    """The Clarion API for asyncio. Use as an async context manager, or await ``aclose()``."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_URL,
        *,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_retry_wait_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers(api_key), timeout=timeout_s, transport=transport
        )
        self.max_retries, self.backoff_s, self.max_retry_wait_s = max_retries, backoff_s, max_retry_wait_s

    async def __aenter__(self) -> AsyncClarion:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _do(self, call: Call) -> Any:
        return parse(call, await self._answer(call))

    async def _all(self, call: Call) -> list[Any]:
        """Every page of a listing: ``call``, then each page its answer's ``Link`` names next."""
        items: list[Any] = []
        page: Call | None = call
        while page is not None:
            response = await self._answer(page)
            items += parse(page, response)
            page = next_page(page, response)
        return items

    async def _answer(self, call: Call) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            response = await self._http.request(call.method, call.path, content=call.body, params=call.params)
            if not should_retry(response, attempt, self.max_retries):
                raise_for(response)
                return response
            await asyncio.sleep(
                retry_after_s(response, attempt, base_s=self.backoff_s, max_s=self.max_retry_wait_s)
            )

    async def send(self, notification: calls.NotificationLike) -> Accepted:
        result: Accepted = await self._do(calls.send(notification))
        return result

    async def send_batch(
        self,
        notifications: Iterable[calls.NotificationLike],
        *,
        batch_size: int = BATCH_SIZE,
        progress: Progress | bool | None = None,
    ) -> list[BatchResult]:
        """As ``Clarion.send_batch``; calls go one after another (the API's limits are per tenant)."""
        report = progress_callback(progress)
        total, done, results = total_of(notifications), 0, []
        for chunk in chunks(notifications, batch_size):
            results.append(await self._do(calls.send_batch(chunk)))
            done += len(chunk)
            if report is not None:
                report(done, total)
        return results

    async def get_notification(self, notification_id: UUID | str) -> NotificationStatus:
        result: NotificationStatus = await self._do(calls.get_notification(notification_id))
        return result

    async def cancel(self, notification_id: UUID | str) -> Cancelled:
        result: Cancelled = await self._do(calls.cancel(notification_id))
        return result

    async def report_engagement(
        self, notification_id: UUID | str, report: EngagementReport | dict[str, Any]
    ) -> EngagementRecorded:
        """Report an open or click your app saw; the same report again is ``duplicate``, not counted."""
        result: EngagementRecorded = await self._do(calls.report_engagement(notification_id, report))
        return result

    async def put_user(self, external_id: str, profile: UserProfile | dict[str, Any]) -> User:
        result: User = await self._do(calls.put_user(external_id, profile))
        return result

    async def get_user(self, external_id: str) -> User:
        result: User = await self._do(calls.get_user(external_id))
        return result

    async def add_device(self, external_id: str, device: Device | dict[str, Any]) -> DeviceOut:
        result: DeviceOut = await self._do(calls.add_device(external_id, device))
        return result

    async def remove_device(self, external_id: str, token: str) -> None:
        await self._do(calls.remove_device(external_id, token))

    async def get_preferences(self, external_id: str) -> Preferences:
        result: Preferences = await self._do(calls.get_preferences(external_id))
        return result

    async def set_preferences(
        self, external_id: str, preferences: list[Preference | dict[str, Any]]
    ) -> Preferences:
        result: Preferences = await self._do(calls.set_preferences(external_id, preferences))
        return result

    async def create_template(self, template: TemplateIn | dict[str, Any]) -> Template:
        result: Template = await self._do(calls.create_template(template))
        return result

    async def list_templates(self, channel: str | None = None) -> list[Template]:
        result: list[Template] = await self._all(calls.list_templates(channel))
        return result

    async def get_template(self, name: str, channel: str | None = None) -> list[Template]:
        result: list[Template] = await self._all(calls.get_template(name, channel))
        return result

    async def preview_template(self, name: str, preview: PreviewIn | dict[str, Any]) -> Preview:
        result: Preview = await self._do(calls.preview_template(name, preview))
        return result

    async def activate_template(self, name: str, *, channel: str, locale: str, version: int) -> Template:
        result: Template = await self._do(
            calls.activate_template(name, channel=channel, locale=locale, version=version)
        )
        return result

    # Analytics

    async def analytics(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        interval: Literal["hour", "day"] = "day",
        group_by: Sequence[str] = (),
        channel: str | None = None,
        template: str | None = None,
        category: str | None = None,
    ) -> list[AnalyticsRow]:
        """Every row of the tenant's analytics over the range (default the last 7 days), in the
        API's order: each page, following ``next_cursor`` to the last."""
        query = calls.analytics_query(
            since=since, until=until, interval=interval, group_by=group_by, channel=channel,
            template=template, category=category,
        )  # fmt: skip
        rows: list[AnalyticsRow] = []
        cursor: str | None = None
        while True:
            page: AnalyticsPage = await self._do(calls.analytics(query, cursor))
            rows += page.rows
            if page.next_cursor is None:
                return rows
            cursor = page.next_cursor
