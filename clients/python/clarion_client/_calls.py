"""Every API operation the clients offer, as a ``Call`` (method, path, body, answer type)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from clarion_client._core import Call, body, segment
from clarion_client.models import (
    Accepted,
    AnalyticsPage,
    BatchResult,
    Cancelled,
    Device,
    DeviceOut,
    EngagementRecorded,
    EngagementReport,
    Notification,
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

NotificationLike = Notification | dict[str, Any]


def send(notification: NotificationLike) -> Call:
    return Call("POST", "/v1/notifications", body(notification, Notification), parse=Accepted)


def send_batch(items: list[dict[str, Any]]) -> Call:
    return Call("POST", "/v1/notifications/batch", body({"notifications": items}), parse=BatchResult)


def get_notification(notification_id: UUID | str) -> Call:
    return Call("GET", f"/v1/notifications/{segment(str(notification_id))}", parse=NotificationStatus)


def cancel(notification_id: UUID | str) -> Call:
    return Call("POST", f"/v1/notifications/{segment(str(notification_id))}/cancel", parse=Cancelled)


def report_engagement(notification_id: UUID | str, report: EngagementReport | dict[str, Any]) -> Call:
    path = f"/v1/notifications/{segment(str(notification_id))}/events"
    return Call("POST", path, body(report, EngagementReport), parse=EngagementRecorded)


def put_user(external_id: str, profile: UserProfile | dict[str, Any]) -> Call:
    return Call("PUT", f"/v1/users/{segment(external_id)}", body(profile, UserProfile), parse=User)


def get_user(external_id: str) -> Call:
    return Call("GET", f"/v1/users/{segment(external_id)}", parse=User)


def add_device(external_id: str, device: Device | dict[str, Any]) -> Call:
    return Call("POST", f"/v1/users/{segment(external_id)}/devices", body(device, Device), parse=DeviceOut)


def remove_device(external_id: str, token: str) -> Call:
    return Call("DELETE", f"/v1/users/{segment(external_id)}/devices/{segment(token)}")


def get_preferences(external_id: str) -> Call:
    return Call("GET", f"/v1/users/{segment(external_id)}/preferences", parse=Preferences)


def set_preferences(external_id: str, preferences: list[Preference | dict[str, Any]]) -> Call:
    items = [p if isinstance(p, Preference) else Preference.model_validate(p) for p in preferences]
    payload = {"preferences": [p.model_dump(mode="json") for p in items]}
    return Call("PUT", f"/v1/users/{segment(external_id)}/preferences", body(payload), parse=Preferences)


def create_template(template: TemplateIn | dict[str, Any]) -> Call:
    return Call("POST", "/v1/templates", body(template, TemplateIn), parse=Template)


def list_templates(channel: str | None) -> Call:
    return Call(
        "GET", "/v1/templates", params={"channel": channel} if channel else None, parse=list[Template]
    )


def get_template(name: str, channel: str | None) -> Call:
    params = {"channel": channel} if channel else None
    return Call("GET", f"/v1/templates/{segment(name)}", params=params, parse=list[Template])


def preview_template(name: str, preview: PreviewIn | dict[str, Any]) -> Call:
    return Call("POST", f"/v1/templates/{segment(name)}/preview", body(preview, PreviewIn), parse=Preview)


def activate_template(name: str, *, channel: str, locale: str, version: int) -> Call:
    payload = {"channel": channel, "locale": locale, "version": version}
    return Call("POST", f"/v1/templates/{segment(name)}/activate", body(payload), parse=Template)


def analytics_query(
    *,
    since: datetime | None,
    until: datetime | None,
    interval: str,
    group_by: Sequence[str],
    channel: str | None,
    template: str | None,
    category: str | None,
) -> dict[str, Any]:
    """The query of every page of one analytics read (``None`` for what the caller left out)."""
    return {
        "since": since.isoformat() if since else None,
        "until": until.isoformat() if until else None,
        "interval": interval,
        "group_by": ",".join(group_by) or None,
        "channel": channel,
        "template": template,
        "category": category,
    }


def analytics(query: dict[str, Any], cursor: str | None) -> Call:
    """One page of ``GET /v1/analytics``; ``query`` without its ``None`` values."""
    params = {k: v for k, v in query.items() if v is not None} | ({"cursor": cursor} if cursor else {})
    return Call("GET", "/v1/analytics", params=params, parse=AnalyticsPage)
