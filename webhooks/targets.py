"""Which addresses a webhook may reach: the rule, a pure function over an address, and the URL check
endpoint create and update run on the host as written.

Any account can register a URL, so without this rule any account could make the service POST into
the operator's own network: its loopback, private ranges, link-local addresses (where the cloud
metadata services answer with credentials) and multicast. The rule refuses every address that is
not globally routable, and the cloud metadata addresses that are (Azure's wire server), unless it
lies in one of the networks the operator allows (`Settings.webhook_allowed_networks`: a
self-hosted operator may want an internal receiver).

Delivery (webhooks/delivery.py) applies it to the address it actually connects to: it resolves the
name once, checks the address and connects to that address, so a name that resolves, or
re-resolves between two lookups, to a refused address is refused too. Create and update refuse an
IP literal or `localhost` at once, with no lookup: a name's lookup at create time would prove
nothing about the lookup at delivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from ipaddress import _BaseNetwork as Network

Address = IPv4Address | IPv6Address

# Metadata services of the clouds, at addresses the classes below may not all cover: AWS, GCP,
# Azure, OCI and DigitalOcean at 169.254.169.254 (link-local), AWS ECS task metadata at
# 169.254.170.2, AWS's IPv6 one, Alibaba's in the shared (CGNAT) range, Oracle's older one, and
# Azure's wire server, a public address.
CLOUD_METADATA = frozenset(ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192", "168.63.129.16",
))  # fmt: skip
_NAT64 = ip_network("64:ff9b::/96")
_LOCALHOST = (ip_address("127.0.0.1"), ip_address("::1"))


def _embedded_v4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries to the same host (mapped, 6to4, NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: Address, allowed: Sequence[Network] = ()) -> str | None:
    """Why a webhook may not reach `address` ("a loopback address", ...), or None when it may."""
    if isinstance(address, IPv6Address):
        address = _embedded_v4(address) or IPv6Address(str(address).split("%")[0])  # a link's scope id aside
    if any(address.version == net.version and address in net for net in allowed):
        return None
    if address in CLOUD_METADATA:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "a reserved address"
    return None


def literal_addresses(host: str) -> tuple[Address, ...]:
    """The addresses a URL's host names without a lookup: an IP literal, or localhost's; () for a name."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: always the loopback
        return _LOCALHOST
    try:
        return (ip_address(host),)
    except ValueError:
        return ()


def refused_message(why: str) -> str:
    return (f"url's host is, or resolves to, {why}, which webhooks may not reach; use a public address, or ask the "
            "operator to allow the network (OPENFT_WEBHOOK_ALLOWED_NETWORKS).")
