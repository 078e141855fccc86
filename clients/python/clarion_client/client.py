"""``Clarion``: the API's operations over httpx, synchronously (``AsyncClarion``, in
``clarion_client.async_client``, is the same with ``await``).

A 429 or 503 is retried up to ``max_retries`` times, after the server's ``Retry-After`` (capped by
``max_retry_wait_s``) or an exponential backoff; the retry sends the very same body, so a send
keeps its ``event_id`` and the API's idempotency makes the retry safe (never two sends). Other
errors raise at once, as ``clarion_client.errors`` exceptions.
"""

from __future__ import annotations

import time
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


class Clarion:
    """The Clarion API, synchronously. Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_URL,
        *,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_retry_wait_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=headers(api_key), timeout=timeout_s, transport=transport
        )
        self.max_retries, self.backoff_s, self.max_retry_wait_s = max_retries, backoff_s, max_retry_wait_s

    def __enter__(self) -> Clarion:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _do(self, call: Call) -> Any:
        return parse(call, self._answer(call))

    def _all(self, call: Call) -> list[Any]:
        """Every page of a listing: ``call``, then each page its answer's ``Link`` names next."""
        items: list[Any] = []
        page: Call | None = call
        while page is not None:
            response = self._answer(page)
            items += parse(page, response)
            page = next_page(page, response)
        return items

    def _answer(self, call: Call) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            response = self._http.request(call.method, call.path, content=call.body, params=call.params)
            if not should_retry(response, attempt, self.max_retries):
                raise_for(response)
                return response
            time.sleep(retry_after_s(response, attempt, base_s=self.backoff_s, max_s=self.max_retry_wait_s))

    # Notifications

    def send(self, notification: calls.NotificationLike) -> Accepted:
        """Accept one notification (a repeat of its ``event_id`` returns the first, ``duplicate``)."""
        result: Accepted = self._do(calls.send(notification))
        return result

    def send_batch(
        self,
        notifications: Iterable[calls.NotificationLike],
        *,
        batch_size: int = BATCH_SIZE,
        progress: Progress | bool | None = None,
    ) -> list[BatchResult]:
        """Send any number of notifications in calls of ``batch_size`` (at most 1,000); each item is
        accepted or refused on its own (see each result's ``results``). ``progress=True`` draws a
        bar on stderr; a callable gets ``(sent so far, total or None)`` after every call."""
        report = progress_callback(progress)
        total, done, results = total_of(notifications), 0, []
        for chunk in chunks(notifications, batch_size):
            results.append(self._do(calls.send_batch(chunk)))
            done += len(chunk)
            if report is not None:
                report(done, total)
        return results

    def get_notification(self, notification_id: UUID | str) -> NotificationStatus:
        result: NotificationStatus = self._do(calls.get_notification(notification_id))
        return result

    def cancel(self, notification_id: UUID | str) -> Cancelled:
        result: Cancelled = self._do(calls.cancel(notification_id))
        return result

    def report_engagement(
        self, notification_id: UUID | str, report: EngagementReport | dict[str, Any]
    ) -> EngagementRecorded:
        """Report an open or click your app saw; the same report again is ``duplicate``, not counted."""
        result: EngagementRecorded = self._do(calls.report_engagement(notification_id, report))
        return result

    # Users and preferences

    def put_user(self, external_id: str, profile: UserProfile | dict[str, Any]) -> User:
        result: User = self._do(calls.put_user(external_id, profile))
        return result

    def get_user(self, external_id: str) -> User:
        result: User = self._do(calls.get_user(external_id))
        return result

    def add_device(self, external_id: str, device: Device | dict[str, Any]) -> DeviceOut:
        result: DeviceOut = self._do(calls.add_device(external_id, device))
        return result

    def remove_device(self, external_id: str, token: str) -> None:
        self._do(calls.remove_device(external_id, token))

    def get_preferences(self, external_id: str) -> Preferences:
        result: Preferences = self._do(calls.get_preferences(external_id))
        return result

    def set_preferences(
        self, external_id: str, preferences: list[Preference | dict[str, Any]]
    ) -> Preferences:
        result: Preferences = self._do(calls.set_preferences(external_id, preferences))
        return result

    # Templates

    def create_template(self, template: TemplateIn | dict[str, Any]) -> Template:
        result: Template = self._do(calls.create_template(template))
        return result

    def list_templates(self, channel: str | None = None) -> list[Template]:
        result: list[Template] = self._all(calls.list_templates(channel))
        return result

    def get_template(self, name: str, channel: str | None = None) -> list[Template]:
        result: list[Template] = self._all(calls.get_template(name, channel))
        return result

    def preview_template(self, name: str, preview: PreviewIn | dict[str, Any]) -> Preview:
        result: Preview = self._do(calls.preview_template(name, preview))
        return result

    def activate_template(self, name: str, *, channel: str, locale: str, version: int) -> Template:
        result: Template = self._do(
            calls.activate_template(name, channel=channel, locale=locale, version=version)
        )
        return result

    # Analytics

    def analytics(
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
            page: AnalyticsPage = self._do(calls.analytics(query, cursor))
            rows += page.rows
            if page.next_cursor is None:
                return rows
            cursor = page.next_cursor
