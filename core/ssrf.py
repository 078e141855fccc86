"""Server-side request forgery: a tenant's webhook URL reaches the public internet and nothing else.

The rule: a URL is ``http`` or ``https`` with a host, no user info, no fragment, at most
``MAX_URL_CHARS``; and every address its host resolves to is a global unicast address (not
loopback, private, link-local (cloud metadata lives at 169.254.169.254), shared, reserved,
multicast or unspecified; IPv4 inside IPv6 is judged as the IPv4 it carries). The operator's
allow-list (``CLARION_WEBHOOK_ALLOW_HOSTS``) names hosts, addresses or networks exempt from the
address rule, never from the shape rule.

It is applied at registration and again at every send, on the addresses the send then connects to
(``Resolved.addresses``): a name that answered with a public address at the check and a private
one a second later (DNS rebinding) is never connected to by name.

Errors (all ``UrlRefused``, with ``code`` for the API's error body)::

    UrlRefused
     ├── code "url_invalid"        shape: scheme, user info, length, host (no zone id), port 1-65535
     ├── code "url_unresolvable"   no address (or DNS slower than the timeout)
     └── code "url_not_allowed"    an address that is not public and not allow-listed
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from core.dns import LookupBusy, Resolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_URL_CHARS = 2048
SCHEMES = frozenset({"http", "https"})


class UrlRefused(ValueError):
    """The URL may not be called; ``code`` says which rule refused it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    """A URL that passed the shape rule, in the parts a send needs."""

    scheme: str
    host: str
    port: int
    target: str  # path and query, what goes after the authority
    authority: str  # what the Host header says

    def with_address(self, address: IPAddress) -> str:
        """The URL with its host replaced by ``address`` (what the send connects to)."""
        shown = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{shown}:{self.port}{self.target}"


@dataclass(frozen=True, slots=True)
class AllowList:
    hosts: frozenset[str]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """``entries`` are host names, IP addresses or CIDR networks (operator configuration:
        a malformed network raises ``ValueError`` at start-up)."""
        hosts: set[str] = set()
        networks = []
        for raw in entries:
            entry = raw.strip().lower().strip("[]")
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry)
        return cls(frozenset(hosts), tuple(networks))

    def admits(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


NOBODY = AllowList(frozenset(), ())


@dataclass(frozen=True, slots=True)
class Resolved:
    url: WebhookUrl
    addresses: tuple[IPAddress, ...]  # every one checked; connect to these only


def parse_url(url: str) -> WebhookUrl:
    """``url`` split into its parts, or ``UrlRefused("url_invalid")``."""
    if len(url) > MAX_URL_CHARS:
        raise UrlRefused("url_invalid", f"The URL is longer than {MAX_URL_CHARS} characters.")
    if not url.isascii() or any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in url):
        raise UrlRefused("url_invalid", "The URL must be ASCII without spaces or control characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlRefused("url_invalid", "The URL cannot be parsed.") from None
    if parts.scheme.lower() not in SCHEMES:
        raise UrlRefused("url_invalid", "The URL must be http or https.")
    if "@" in parts.netloc or parts.username is not None:
        raise UrlRefused("url_invalid", "The URL may not carry a user name or password.")
    if parts.fragment:
        raise UrlRefused("url_invalid", "The URL may not carry a fragment.")
    if port == 0:
        raise UrlRefused("url_invalid", "The URL's port must be 1 to 65535.")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise UrlRefused("url_invalid", "The URL has no host.")
    if "%" in host:  # an IPv6 zone id (RFC 6874) names a link of the sending host
        raise UrlRefused("url_invalid", "The URL's host may not hold '%' (an IPv6 zone id, an escape).")
    scheme = parts.scheme.lower()
    port = port or (443 if scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default_port = port == (443 if scheme == "https" else 80)
    shown_host = f"[{host}]" if ":" in host else host
    return WebhookUrl(scheme, host, port, target, shown_host if default_port else f"{shown_host}:{port}")


def is_public(address: IPAddress) -> bool:
    """A global unicast address (IPv4 carried in IPv6 judged as IPv4)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if inner is not None:
            return is_public(inner)
        if address in _NAT64:
            return is_public(ipaddress.IPv4Address(address.packed[-4:]))
        if address in _DOCUMENTATION_V6:
            return False
    elif address in _IETF_PROTOCOL_V4 and address not in _GLOBAL_ANYCAST_V4:
        return False
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified)


def _literal(host: str) -> IPAddress | None:
    """``host`` as an address when it is written as one (``127.0.0.1``, ``::1``), else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _lookup(
    host: str, port: int, *, timeout_s: float, resolver: Resolver | None, key: str
) -> list[Any]:
    try:
        if resolver is not None:
            return await resolver.getaddrinfo(host, port, key=key, timeout_s=timeout_s)
        return await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s
        )
    except LookupBusy as busy:
        waiting = "of it" if busy.host_busy else "of this tenant's hosts"
        raise UrlRefused(
            "url_unresolvable", f"The host {host} does not resolve yet: earlier lookups {waiting} still wait."
        ) from None
    except (OSError, TimeoutError, UnicodeError):
        raise UrlRefused("url_unresolvable", f"The host {host} does not resolve.") from None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# RFC 9637's documentation prefix, which Python's ipaddress (3.12) does not know yet: it calls
# 3fff::1 global. Not routable, so never a webhook's address.
_DOCUMENTATION_V6 = ipaddress.ip_network("3fff::/20")
# RFC 6890's IETF protocol assignments, not globally reachable but for two anycast addresses (RFC
# 7723, 8155); Python 3.11 calls all of it global (192.0.0.8 passed), newer Pythons as here.
_IETF_PROTOCOL_V4 = ipaddress.ip_network("192.0.0.0/24")
_GLOBAL_ANYCAST_V4 = (ipaddress.ip_address("192.0.0.9"), ipaddress.ip_address("192.0.0.10"))


LOOKUP_TIMEOUT_S = 2.0  # a host name's lookup, at most, before ``resolve`` gives up on it


async def resolve(
    url: str | WebhookUrl,
    *,
    allow: AllowList,
    timeout_s: float = LOOKUP_TIMEOUT_S,
    resolver: Resolver | None = None,
    key: str = "",
) -> Resolved:
    """The addresses ``url`` may be called at (all of its host's, every one checked); else
    ``UrlRefused``. An allow-listed host name skips the address rule. A literal address is not
    looked up; a name is, on ``resolver`` (its lookups counted against ``key``: ``core/dns.py``)
    or on the event loop's executor when there is none."""
    parsed = url if isinstance(url, WebhookUrl) else parse_url(url)
    literal = _literal(parsed.host)
    addresses: list[IPAddress] = [literal] if literal is not None else []
    if literal is None:
        for info in await _lookup(parsed.host, parsed.port, timeout_s=timeout_s, resolver=resolver, key=key):
            text = str(info[4][0]).split("%", 1)[0]  # an IPv6 scope id (fe80::1%eth0)
            address = ipaddress.ip_address(text)
            if address not in addresses:
                addresses.append(address)
    if not addresses:
        raise UrlRefused("url_unresolvable", f"The host {parsed.host} does not resolve.")
    if parsed.host not in allow.hosts:
        for address in addresses:
            if not is_public(address) and not allow.admits(address):
                raise UrlRefused(
                    "url_not_allowed",
                    f"The host {parsed.host} resolves to {address}, which is not a public address.",
                )
    return Resolved(parsed, tuple(addresses))
