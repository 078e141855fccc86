"""What the local FCM refuses as ``INVALID_ARGUMENT``: a ``messages:send`` body checked field by
field as FCM HTTP v1 checks it (docs/providers.md 7.1), with FCM's own error messages.
"""

from __future__ import annotations

import json
import re
from typing import Any

_TARGETS = ("token", "topic", "condition", "fid")
_MESSAGE_FIELDS = {"name", "data", "notification", "android", "webpush", "apns", "fcm_options", *_TARGETS}
_NOTIFICATION_FIELDS = {"title", "body", "image"}
_ANDROID_FIELDS = {
    "collapse_key",
    "priority",
    "ttl",
    "restricted_package_name",
    "data",
    "notification",
    "fcm_options",
    "direct_boot_ok",
    "direct_book_ok",
    "bandwidth_constrained_ok",
    "restricted_satellite_ok",
}
_APNS_FIELDS = {"headers", "payload", "fcm_options", "live_activity_token"}
_TOPIC = re.compile(r"[a-zA-Z0-9\-_.~%]+")
_DURATION = re.compile(r"\d{1,9}(\.\d{1,9})?s")


def reserved_data_key(key: str) -> bool:
    """FCM refuses these ``data`` keys: the v1 reference's reserved words (docs/providers.md 7.1)."""
    return key in ("from", "message_type") or key.startswith(("google", "gcm"))


def unknown_fields(doc: dict[str, Any], allowed: set[str], where: str) -> str | None:
    """FCM's message for the first key of ``doc`` (at ``where``) not in ``allowed``, or None."""
    for key in doc:
        if key not in allowed:
            return f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field."
    return None


def _string_map(value: Any, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"Invalid value at '{where}' (type.googleapis.com/google.protobuf.Struct), {value!r}"
    for i, item in enumerate(value.values()):
        if not isinstance(item, str):
            return f"Invalid value at '{where}[{i}].value' (TYPE_STRING), {item!r}"
    return None


def validate_message(message: Any) -> str | None:
    """FCM's INVALID_ARGUMENT message for a bad ``message``, or None."""
    if not isinstance(message, dict):
        return "Request contains an invalid argument: message is required."
    problem = unknown_fields(message, _MESSAGE_FIELDS, "message")
    if problem:
        return problem
    targets = [t for t in _TARGETS if message.get(t)]
    if len(targets) != 1:
        return "Exactly one of token, topic, condition or fid must be set."
    if not all(isinstance(message[t], str) for t in targets):
        return f"Invalid value at 'message.{targets[0]}' (TYPE_STRING)"
    topic = message.get("topic")
    if isinstance(topic, str) and not _TOPIC.fullmatch(topic.removeprefix("/topics/")):
        return "Invalid topic name"
    data = message.get("data", {})
    problem = _string_map(data, "message.data")
    if problem:
        return problem
    for key in data:
        if reserved_data_key(key):
            return f"Invalid data payload key: {key}"
    notification = message.get("notification", {})
    if not isinstance(notification, dict):
        return "Invalid value at 'message.notification' (type.googleapis.com/google.firebase.fcm.v1.Notification)"
    problem = unknown_fields(notification, _NOTIFICATION_FIELDS, "message.notification")
    if problem or not all(isinstance(v, str) for v in notification.values()):
        return problem or "Invalid value at 'message.notification' (TYPE_STRING)"
    problem = _android(message.get("android", {})) or _apns(message.get("apns", {}), bool(notification))
    if problem:
        return problem
    size = len(json.dumps({"notification": notification, "data": data}).encode())
    if size > 4096:
        return "Message is too big"
    return None


def _android(android: Any) -> str | None:
    if not isinstance(android, dict):
        return "Invalid value at 'message.android' (type.googleapis.com/google.firebase.fcm.v1.AndroidConfig)"
    problem = unknown_fields(android, _ANDROID_FIELDS, "message.android")
    if problem:
        return problem
    priority = android.get("priority", "NORMAL")
    if not isinstance(priority, str) or priority.upper() not in {"NORMAL", "HIGH"}:
        return "Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority)"
    ttl = android.get("ttl", "0s")
    if not isinstance(ttl, str) or not _DURATION.fullmatch(ttl) or float(ttl[:-1]) > 2_419_200:
        return "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration)"
    for key in ("collapse_key", "restricted_package_name"):
        if key in android and not isinstance(android[key], str):
            return f"Invalid value at 'message.android.{key}' (TYPE_STRING)"
    if "data" in android:
        return _string_map(android["data"], "message.android.data")
    return None


def _apns(apns: Any, has_notification: bool) -> str | None:
    if not isinstance(apns, dict):
        return "Invalid value at 'message.apns' (type.googleapis.com/google.firebase.fcm.v1.ApnsConfig)"
    problem = unknown_fields(apns, _APNS_FIELDS, "message.apns")
    if problem:
        return problem
    headers = apns.get("headers", {})
    problem = _string_map(headers, "message.apns.headers")
    if problem:
        return problem
    payload = apns.get("payload", {})
    if not isinstance(payload, dict):
        return "Invalid value at 'message.apns.payload' (type.googleapis.com/google.protobuf.Struct)"
    aps = payload.get("aps", {})
    alert = has_notification or (
        isinstance(aps, dict) and bool(aps.get("alert") or aps.get("badge") or aps.get("sound"))
    )
    if headers.get("apns-priority") == "10" and not alert:
        return "Invalid APNs priority: a data-only (background) message must use apns-priority 5."
    return None
