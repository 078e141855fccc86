"""A tenant's preference read or write by API key (``GET/PUT /v1/users/{id}/preferences``) checks
out one pooled connection, for the user's lookup and its work together: it looked the user up on
one checkout and did its work on a second, queueing for the pool twice while it held its tenant's
turn (``api/preference_gate.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from clarion.settings import Settings
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo
from tests.fixtures.preferences import new_user


@pytest.fixture(scope="module")
async def one_connection_api(settings: Settings) -> AsyncIterator[ApiServer]:
    api = ApiServer(settings.model_copy(update={"db_pool_size": 1}))
    await api.start()
    yield api
    await api.stop()


@contextmanager
def checkouts(api: ApiServer) -> Iterator[list[Any]]:
    """The connections the API's engine checks out while inside, one entry per checkout."""
    taken: list[Any] = []
    engine = api.app.state.engine.sync_engine

    def checkout(dbapi_connection: Any, *_: Any) -> None:
        taken.append(dbapi_connection)

    event.listen(engine, "checkout", checkout)
    try:
        yield taken
    finally:
        event.remove(engine, "checkout", checkout)


async def test_a_keyed_preference_read_and_write_each_check_out_one_connection(
    one_connection_api: ApiServer, tenant: TenantInfo
) -> None:
    async with api_client(one_connection_api.url, tenant.key) as client:
        await new_user(client)  # also puts the key in the API's cache: no checkout for it after
        path = "/v1/users/u-pref/preferences"
        entries = {"preferences": [{"channel": "email", "category": "news", "opted_in": False}]}
        assert (await client.get(path)).status_code == 200

        with checkouts(one_connection_api) as read:
            got = await client.get(path)
        with checkouts(one_connection_api) as written:
            put = await client.put(path, json=entries)
        with checkouts(one_connection_api) as unknown:
            missing = await client.get("/v1/users/nobody/preferences")

    assert got.status_code == 200, got.text
    assert put.status_code == 200 and put.json()["preferences"] == entries["preferences"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_user"
    assert (len(read), len(written), len(unknown)) == (1, 1, 1)
