"""The SSRF rule: which IP addresses a media URL may reach.

Refused unless ``mllm.allow_private_urls``: loopback, private, link-local, multicast,
reserved, unspecified, shared (CGNAT) and cloud-metadata addresses, and every IPv6 form that
embeds an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4,
Teredo) judged by the address it embeds. Only globally routable unicast addresses pass.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Instance-metadata endpoints of the big clouds (AWS v4 and v6, Alibaba, ECS task metadata).
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def parse_address(text: str) -> IPAddress | None:
    """``text`` as an IP address (a zone id like ``%eth0`` dropped), or None for a host name."""
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def forbidden_reason(address: IPAddress) -> str | None:
    """Why ``address`` may not be fetched from (None: it is a public unicast address)."""
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:a.b.c.d is a.b.c.d, nothing else
    for candidate in (mapped,) if mapped is not None else (address, *_embedded_ipv4(address)):
        reason = _own_reason(candidate)
        if reason is not None:
            return reason
    return None


def _own_reason(address: IPAddress) -> str | None:
    checks = (
        (address in METADATA_ADDRESSES, "a cloud metadata address"),
        (address.is_loopback, "a loopback address"),
        (address.is_unspecified, "an unspecified address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_private, "a private address"),
        (address.is_reserved, "a reserved address"),
        (not address.is_global, "not a public address"),
    )
    return next((reason for hit, reason in checks if hit), None)


def _embedded_ipv4(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries (mapped, NAT64, 6to4, Teredo client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return ()
    found = [address.ipv4_mapped, address.sixtofour, address.teredo[1] if address.teredo else None]
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return tuple(a for a in found if a is not None)
