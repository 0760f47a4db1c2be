"""Which addresses webfetch may connect to: public ones, and the networks a config allows.

A host name is resolved here, never later by the HTTP client, and the caller
connects to the address returned, so the answer that was judged is the one used.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import TypeAlias

import httpx

from relayq.builtins._common import ToolFailure

__all__ = ["NetGuard", "non_global_kind"]

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

_KINDS = (
    ("loopback", "is_loopback"),
    ("unspecified", "is_unspecified"),
    ("link-local", "is_link_local"),
    ("multicast", "is_multicast"),
    ("reserved", "is_reserved"),
    ("private", "is_private"),
)


def non_global_kind(ip: IPAddress) -> str | None:
    """Why `ip` is no public unicast address ("loopback", "private", ...), or None if it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address wrapped in IPv6 reaches that IPv4 address.
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is not None:
            kind = non_global_kind(inner)
            return f"{kind} (as {ip})" if kind else None
    for kind, attribute in _KINDS:
        if getattr(ip, attribute):
            return kind
    return None if ip.is_global else "non-global"


class NetGuard:
    """Resolves a URL's host and picks an address webfetch may connect to."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(net, strict=False) for net in allowed
        )

    def refusal(self, ip: IPAddress) -> str | None:
        if any(ip.version == net.version and ip in net for net in self.allowed):
            return None
        return non_global_kind(ip)

    async def address_for(self, url: httpx.URL) -> str:
        """An allowed address of `url`'s host, or a ToolFailure saying why there is none."""
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ToolFailure(f"could not fetch {url}: cannot resolve {host}: {exc}") from exc
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        for ip in addresses:
            if self.refusal(ip) is None:
                return str(ip)
        first = addresses[0]
        what = f"{host} is" if host == str(first) else f"{host} resolves to {first},"
        raise ToolFailure(
            f"refused to fetch {url}: {what} a {self.refusal(first)} address. "
            "webfetch reaches only public addresses unless the agent's builtins config "
            "allows the network (webfetch_allowed_networks)"
        )
