"""What the OpenAPI document says beyond what FastAPI infers: the error answers of every operation
and who may call it.

FastAPI documents a route's success and (for parameters it validates) a 422 with its own error
model; Clarion answers every failure with ``{"error": {"code", "message", "details"}}`` and from
places FastAPI cannot see (the size and header limits around the app, the authentication the
routes call, the database being away). This module adds, per operation:

- ``401``/``403`` and the ``bearerAuth`` security requirement where an API key is required (found
  from the route's dependencies, or declared by the route as the hand-parsed sends do);
- ``400``/``413`` where a JSON body is read, ``404`` where a path names a resource, ``422`` where
  anything is validated, ``431`` and ``503`` everywhere the database or the headers are involved;
- the codes a route raises itself (``EXTRA_ERRORS``), such as the 409 of an ``event_id`` reuse.

Every error answer points at the shared ``Error`` schema. ``tests/abuse/test_schemathesis_all_checks.py``
holds the document to what the API answers (schemathesis with every check).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from api.allow import flat_routes
from api.auth import require_operator

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Error",
    "description": "Every failure's body: a machine-readable code, a human message, optional details.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "stable machine-readable code, like not_found"},
                "message": {"type": "string", "description": "what went wrong, for a human"},
                "details": {"description": "more about the failure (the bad fields of a 422...)"},
            },
        }
    },
}

DESCRIPTIONS = {
    400: "The body is not valid JSON (`malformed_json`).",
    401: "No API key, or an unknown or revoked one (`unauthorized`).",
    403: "The API key lacks the scope this operation needs (`forbidden`), or a link's token is invalid.",
    404: "No such resource for your tenant.",
    409: "The request conflicts with the resource's state.",
    413: "The body is larger than the limit (`payload_too_large`).",
    415: "The body is not sent as JSON (`unsupported_media_type`).",
    422: "A value is invalid; `details` names the bad fields (the first 20, then how many more).",
    429: "A rate-limit rule or a concurrency limit refuses the request for now; `Retry-After` says when to retry.",
    408: "The request's head did not arrive within `CLARION_API_HEAD_TIMEOUT_S` (`request_timeout`).",
    431: "The request headers are larger than 16 KiB (`headers_too_large`).",
    503: "The notification log is unavailable (`database_unavailable`); retry after `Retry-After`.",
}

PUBLIC_ERRORS = (408, 431, 503)

# Codes routes raise themselves, by (method, path), beyond what ``document`` infers.
EXTRA_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/notifications"): (409, 415, 429),
    ("post", "/v1/notifications/batch"): (415, 429),
    ("get", "/v1/notifications"): (429,),  # too_many_searches (api/search_limit.py)
    ("get", "/v1/ops/dlq/{channel}"): (429,),
    ("post", "/v1/ops/dlq/{channel}/redrive"): (429,),  # the tenant's budget (api/tenant_budget.py)
    ("get", "/v1/analytics"): (429,),  # the search share too
    ("post", "/v1/webhook-endpoints/{endpoint_id}/replay"): (409,),  # endpoint_disabled, _backlog, _busy
    ("patch", "/v1/webhook-endpoints/{endpoint_id}"): (409,),  # endpoint_busy: a replay in flight
    ("delete", "/v1/webhook-endpoints/{endpoint_id}"): (409,),
    ("put", "/v1/rate-limits/{rule_id}"): (409,),  # limit_reached: recipient rules
    ("post", "/v1/notifications/{notification_id}/cancel"): (409,),
    ("post", "/v1/notifications/{notification_id}/events"): (415, 429),  # engagement_busy
    ("post", "/v1/device/events"): (403, 404, 415, 429),  # api/engagement_gate.py
    ("post", "/v1/templates"): (409,),
    ("post", "/v1/rate-limits"): (409,),
    ("post", "/v1/keys/{key_id}/revoke"): (409,),
    ("get", "/v1/ops/cluster/queues"): (401, 404),
    ("post", "/v1/webhooks/twilio/status"): (400, 403, 404, 422, 429),  # api/callback_gate.py
    ("post", "/v1/webhooks/sendgrid/events"): (400, 403, 404, 413, 422, 429),
    ("get", "/v1/categories/{name}"): (404,),
    ("get", "/v1/preferences"): (403, 404, 429),  # 429: preferences_busy (api/preference_gate.py)
    ("get", "/v1/users/{external_id}/preferences"): (429,),  # preferences_busy, the keyed gate
    ("put", "/v1/users/{external_id}/preferences"): (429,),
    ("post", "/v1/preferences"): (403, 404, 409, 429),  # 409: a user's preferences are capped
    ("get", "/v1/unsubscribe"): (403, 404, 429),
    ("post", "/v1/unsubscribe"): (403, 404, 429),
    ("get", "/preferences"): (403, 404, 429),
    ("get", "/t/o/{token}"): (403, 404),
    ("get", "/t/c/{token}"): (403, 404),
}
# Pages for people: their 403/404 are HTML pages (a link's token expired), not JSON.
HTML_PAGES = {("get", "/preferences"), ("get", "/v1/unsubscribe")}
# Answered without the database or any header limit mattering.
NO_ERRORS = {("get", "/healthz"), ("get", "/readyz")}

# For text parameters that reach a query: PostgreSQL cannot hold a NUL character, and the API would
# refuse it anyway (``invalid_value``); the pattern says so in the document.
NO_NUL = r"^[^\x00]*$"

BEARER = {"bearerAuth": {"type": "http", "scheme": "bearer", "description": "an API key, clk_<id>_<secret>"}}
KEYED = "x-clarion-api-key"  # set by routes that authenticate in their body (``openapi_extra``)


def _calls(dependant: Dependant) -> Iterable[Any]:
    for dep in dependant.dependencies:
        yield dep.call
        yield from _calls(dep)


def _needs_key(route: APIRoute) -> bool:
    if (route.openapi_extra or {}).get(KEYED):
        return True
    return any(
        getattr(call, "__qualname__", "").startswith("require.<locals>") for call in _calls(route.dependant)
    )


def _is_operator(route: APIRoute) -> bool:
    return any(call is require_operator for call in _calls(route.dependant))


def _links(schema: dict[str, Any]) -> None:
    """A created template's preview names its channel, locale and version: templates are found by
    (name, channel), so a link with the name alone leads to previews of templates that do not exist
    (a push preview of an sms template is rightly a 404)."""
    paths = schema.get("paths", {})
    try:
        created = paths["/v1/templates"]["post"]["responses"]["201"]
        preview = paths["/v1/templates/{name}/preview"]["post"]["operationId"]
        activate = paths["/v1/templates/{name}/activate"]["post"]["operationId"]
    except KeyError:
        return
    created["links"] = {
        "PreviewCreatedTemplate": {
            "operationId": preview,
            "parameters": {"name": "$response.body#/name"},
            "requestBody": {
                "channel": "$response.body#/channel",
                "locale": "$response.body#/locale",
                "version": "$response.body#/version",
                "data": "$response.body#/sample_data",
            },
        },
        "ActivateCreatedTemplate": {  # a link with the name alone activated versions that never existed
            "operationId": activate,
            "parameters": {"name": "$response.body#/name"},
            "requestBody": {
                "channel": "$response.body#/channel",
                "locale": "$response.body#/locale",
                "version": "$response.body#/version",
            },
        },
    }


def document(app: FastAPI, schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's document of ``app``) with the error answers and security added."""
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    components.setdefault("securitySchemes", {}).update(BEARER)
    components["schemas"].pop("HTTPValidationError", None)
    components["schemas"].pop("ValidationError", None)
    routes = {
        (method.lower(), route.path_format): route
        for route, _ in flat_routes(app.routes)
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods or ()
    }
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            route = routes.get((method, path))
            operation.pop(KEYED, None)
            if route is None or (method, path) in NO_ERRORS:
                continue
            codes = set(PUBLIC_ERRORS) | set(EXTRA_ERRORS.get((method, path), ()))
            if _needs_key(route):
                codes |= {401, 403}
                operation["security"] = [{"bearerAuth": []}]
            elif _is_operator(route):
                operation["security"] = [{"bearerAuth": []}]
            if "requestBody" in operation:
                codes |= {400, 413, 422}
            if operation.get("parameters") or "requestBody" in operation:
                codes.add(422)
            if any(p.get("in") == "path" for p in operation.get("parameters", [])):
                codes.add(404)
            responses = operation.setdefault("responses", {})
            for code in sorted(codes):
                responses[str(code)] = _error_response(code, existing=responses.get(str(code)))
                if (method, path) in HTML_PAGES and code in (403, 404, 429):
                    responses[str(code)]["content"] = {"text/html": {"schema": {"type": "string"}}}
    _links(schema)
    return schema


def _error_response(code: int, existing: dict[str, Any] | None) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": DESCRIPTIONS[code],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if existing and existing.get("description") and code not in (422,):
        response["description"] = existing["description"]
    if code in (429, 503):
        response["headers"] = {
            "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}
        }
    return response
