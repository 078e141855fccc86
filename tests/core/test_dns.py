"""One tenant's DNS that hangs keeps at most its share of the lookup threads; other tenants'
lookups go on, and a literal address is never looked up (``core/dns.py``, ``core/ssrf.py``).

The system resolver is replaced by a function that blocks until released, as a nameserver that
never answers would: the one outside part these tests stand in for."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from core import ssrf
from core.dns import LookupBusy, Resolver
from harness.services import wait_until

ALLOW_LOCAL = ssrf.AllowList.parse(["127.0.0.0/8"])
HUNG = "hung.example"


class Nameserver:
    """Answers every host with 127.0.0.1 at once, except ``HUNG``, which waits for ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[Any]:
        self.asked.append(host)
        if host == HUNG:
            self.release.wait(30)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


@pytest.fixture
def nameserver() -> Iterator[Nameserver]:
    ns = Nameserver()
    yield ns
    ns.release.set()


async def test_a_tenant_whose_lookups_hang_is_refused_past_its_share_and_another_still_resolves(
    nameserver: Nameserver,
) -> None:
    resolver = Resolver(threads=4, per_key=3, per_host=2, lookup=nameserver)
    try:
        for _ in range(2):
            with pytest.raises(TimeoutError):
                await resolver.getaddrinfo(HUNG, 80, key="a", timeout_s=0.1)
        assert resolver.outstanding("a") == 2  # given up on, still holding their threads
        with pytest.raises(LookupBusy) as busy:
            await resolver.getaddrinfo(HUNG, 80, key="a", timeout_s=0.1)
        assert busy.value.host_busy
        assert nameserver.asked.count(HUNG) == 2  # the refused one never reached the resolver
        # The same tenant's other host still resolves, within the tenant's share.
        assert await resolver.getaddrinfo("other.a.example", 80, key="a", timeout_s=5)

        answer = await resolver.getaddrinfo("hooks.b.example", 80, key="b", timeout_s=5)
        assert answer[0][4][0] == "127.0.0.1"

        nameserver.release.set()
        await wait_until(lambda: resolver.outstanding("a") == 0, 5, 0.01)
        assert await resolver.getaddrinfo(HUNG, 80, key="a", timeout_s=5)
    finally:
        resolver.close()


async def test_ssrf_resolve_looks_up_names_on_the_resolver_and_never_a_literal_address(
    nameserver: Nameserver,
) -> None:
    resolver = Resolver(threads=2, per_key=1, per_host=1, lookup=nameserver)
    try:
        literal = await ssrf.resolve("http://127.0.0.1:8080/x", allow=ALLOW_LOCAL, resolver=resolver, key="t")
        assert [str(a) for a in literal.addresses] == ["127.0.0.1"] and nameserver.asked == []

        named = await ssrf.resolve("http://hooks.example/x", allow=ALLOW_LOCAL, resolver=resolver, key="t")
        assert [str(a) for a in named.addresses] == ["127.0.0.1"] and nameserver.asked == ["hooks.example"]

        with pytest.raises(ssrf.UrlRefused) as slow:
            await ssrf.resolve(
                f"http://{HUNG}/", allow=ALLOW_LOCAL, resolver=resolver, key="t", timeout_s=0.1
            )
        assert slow.value.code == "url_unresolvable"
        with pytest.raises(ssrf.UrlRefused) as busy:  # its one lookup still outstanding
            await ssrf.resolve("http://hooks.example/x", allow=ALLOW_LOCAL, resolver=resolver, key="t")
        assert busy.value.code == "url_unresolvable" and "still wait" in busy.value.message
    finally:
        resolver.close()


async def test_a_lookup_still_waiting_for_a_thread_when_its_caller_gives_up_holds_nothing(
    nameserver: Nameserver,
) -> None:
    resolver = Resolver(threads=1, per_key=4, per_host=4, lookup=nameserver)
    try:
        with pytest.raises(TimeoutError):
            await resolver.getaddrinfo(HUNG, 80, key="a", timeout_s=0.1)  # holds the one thread
        with pytest.raises(TimeoutError):  # queued behind it, then given up on
            await resolver.getaddrinfo("b.example", 80, key="b", timeout_s=0.1)
        await wait_until(lambda: resolver.outstanding("b") == 0, 5, 0.01)
        assert "b.example" not in nameserver.asked and resolver.outstanding("a") == 1
    finally:
        resolver.close()
