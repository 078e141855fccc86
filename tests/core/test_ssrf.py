"""The SSRF rule on its own: hostile URLs, every resolved address, the operator's allow-list."""

from __future__ import annotations

import ipaddress

import pytest

from core import ssrf

ALLOW_LOCAL = ssrf.AllowList.parse(["127.0.0.1"])


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_FLUSHALL",
        "javascript:alert(1)",
        "http://user:pass@example.com/",
        "http://user@example.com/",
        "http://example.com/#frag",
        "http:///nohost",
        "http://exa mple.com/",
        "http://example.com/\r\nX-Injected: 1",
        "http://exämple.com/",
        "http://example.com:99999/",
        # Found accepted on 2026-11-30: port 0 was stored as written and called on port 80 (the
        # scheme's default took its place); a zone id names a link of the sending host, which no
        # public address has, and was carried into the address the send connects to.
        "http://1.1.1.1:0/",
        "https://example.com:00/",
        "http://[2606:4700:4700::1111%25eth0]/",
        "http://[2606:4700:4700::1111%eth0]/",
        "http://" + "a" * 10_000 + ".com/",
        "",
    ],
)
def test_a_url_of_the_wrong_shape_is_refused(url: str) -> None:
    with pytest.raises(ssrf.UrlRefused) as refused:
        ssrf.parse_url(url)
    assert refused.value.code == "url_invalid"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://127.1.2.3:8080/x",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",  # carrier-grade NAT (Alibaba's metadata lives at 100.100.100.200)
        "http://0.0.0.0/",
        "http://[::ffff:127.0.0.1]/",  # IPv4 inside IPv6
        "http://[::ffff:169.254.169.254]/",
        "http://[fd00:ec2::254]/",  # AWS's IPv6 metadata address
        "http://[fe80::1]/",
        "http://localhost/",  # a name resolving to loopback
        "http://LOCALHOST./",
        "http://2130706433/",  # 127.0.0.1 written as one number
        "http://0x7f.1/",
        "http://224.0.0.1/",
    ],
)
async def test_an_address_that_is_not_public_is_refused_after_resolution(url: str) -> None:
    with pytest.raises(ssrf.UrlRefused) as refused:
        await ssrf.resolve(url, allow=ssrf.NOBODY)
    assert refused.value.code in ("url_not_allowed", "url_unresolvable"), refused.value
    if "0x7f" not in url:  # the hex form is the resolver's choice; refused either way
        assert refused.value.code == "url_not_allowed"


async def test_a_name_that_does_not_resolve_is_refused() -> None:
    with pytest.raises(ssrf.UrlRefused) as refused:
        await ssrf.resolve("http://no-such-host.invalid/", allow=ssrf.NOBODY)
    assert refused.value.code == "url_unresolvable"


async def test_the_allow_list_admits_what_it_names_and_nothing_else() -> None:
    resolved = await ssrf.resolve("http://127.0.0.1:8080/hooks?a=1", allow=ALLOW_LOCAL)
    assert resolved.addresses == (ipaddress.ip_address("127.0.0.1"),)
    assert resolved.url.with_address(resolved.addresses[0]) == "http://127.0.0.1:8080/hooks?a=1"
    assert resolved.url.authority == "127.0.0.1:8080"
    with pytest.raises(ssrf.UrlRefused):
        await ssrf.resolve("http://10.0.0.1/", allow=ALLOW_LOCAL)
    by_network = ssrf.AllowList.parse(["10.0.0.0/8", " ", "hooks.internal"])
    assert (await ssrf.resolve("http://10.1.2.3/", allow=by_network)).addresses
    assert by_network.hosts == frozenset({"hooks.internal"})


def test_public_addresses_pass_and_their_disguises_do_not() -> None:
    assert ssrf.is_public(ipaddress.ip_address("93.184.216.34"))
    assert ssrf.is_public(ipaddress.ip_address("2606:4700::1111"))
    assert not ssrf.is_public(ipaddress.ip_address("::ffff:10.0.0.1"))
    assert not ssrf.is_public(ipaddress.ip_address("2002:7f00:1::"))  # 6to4 of 127.0.0.1
    assert not ssrf.is_public(ipaddress.ip_address("64:ff9b::a9fe:a9fe"))  # NAT64 of 169.254.169.254
    assert not ssrf.is_public(ipaddress.ip_address("3fff::1"))  # RFC 9637 documentation prefix
    assert not ssrf.is_public(ipaddress.ip_address("3fff:fff:ffff::1"))
    assert ssrf.is_public(ipaddress.ip_address("3fff:1000::1"))  # past the /20: global unicast
    assert not ssrf.is_public(ipaddress.ip_address("192.0.0.8"))  # RFC 6890 (Python 3.11: "global")
    assert ssrf.is_public(ipaddress.ip_address("192.0.0.9"))  # RFC 7723's global anycast


def test_the_host_header_keeps_the_name_and_a_non_default_port() -> None:
    url = ssrf.parse_url("https://Hooks.Example.com:8443/in")
    assert (url.host, url.port, url.authority, url.target) == (
        "hooks.example.com",
        8443,
        "hooks.example.com:8443",
        "/in",
    )
    v6 = ssrf.parse_url("http://[2606:4700::1111]/")
    assert v6.with_address(ipaddress.ip_address("2606:4700::1111")) == "http://[2606:4700::1111]:80/"
