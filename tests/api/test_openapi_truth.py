"""What the OpenAPI document promises about errors and methods, checked against the API (the whole
document is fuzzed with every schemathesis check in tests/abuse/test_schemathesis_all_checks.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import TenantInfo


async def test_every_operation_documents_its_errors_with_the_error_schema(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if path in ("/healthz", "/readyz"):
                continue
            responses = operation["responses"]
            errors = {code: r for code, r in responses.items() if code.startswith(("4", "5"))}
            assert {"408", "431", "503"} <= errors.keys(), (method, path)
            if operation.get("security"):
                assert "401" in errors, (method, path)
            if "requestBody" in operation:
                assert {"400", "413", "422"} <= errors.keys(), (method, path)
            for code, response in errors.items():
                schema = next(iter(response["content"].values()))["schema"]
                assert schema in ({"$ref": "#/components/schemas/Error"}, {"type": "string"}), (path, code)
    send = document["paths"]["/v1/notifications"]["post"]["responses"]
    assert {"401", "403", "409", "415", "422", "429"} <= send.keys()


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/users/u-1", "GET, PUT"),
        ("GET", "/v1/notifications/batch", "POST"),  # not the {notification_id} route's 422
        ("PUT", "/v1/notifications", "GET, POST"),
        ("OPTIONS", "/v1/templates", "GET, POST"),
        ("PATCH", "/v1/rate-limits/0193a8c2-0000-7000-8000-000000000000", "DELETE, GET, PUT"),
    ],
)
async def test_a_method_the_path_lacks_is_405_naming_every_method_of_the_path(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["code"] == "method_not_allowed"


async def test_a_key_cannot_revoke_itself(client: httpx.AsyncClient, tenant: TenantInfo) -> None:
    own_id = tenant.key.split("_")[1]
    response = await client.post(f"/v1/keys/{own_id}/revoke")
    assert response.status_code == 409 and response.json()["error"]["code"] == "revoking_own_key"
    assert (await client.get("/v1/keys")).status_code == 200  # still works


async def test_a_cursor_of_the_documented_shape_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/notifications", params={"cursor": "0." + "0" * 32})
    assert response.status_code == 200 and response.json() == {"items": [], "next_cursor": None}


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-1"])
async def test_a_number_is_not_a_date_time(client: httpx.AsyncClient, value: str) -> None:
    response = await client.get("/v1/notifications", params={"since": value})
    assert response.status_code == 422


@pytest.mark.parametrize("value", [True, "60", 0])
async def test_an_integer_setting_takes_a_json_integer_only(client: httpx.AsyncClient, value: object) -> None:
    response = await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": value})
    assert response.status_code == 422
    assert (
        await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": 60.0})
    ).status_code == 200
