"""Multiaddrs taken apart in one place, by py-multiaddr.

Addresses reach the node from peers (identify, AutoNAT, DCUtR, relay reservations, mDNS), from
the user (config, CLI, invites, doctor) and from py-libp2p. Every function here takes one as
text, bytes (the binary form peers send, or its text) or a ``Multiaddr``, and either answers or
raises :class:`AddrError`, a ``ValueError`` whose message names the address and what is wrong
with it: py-multiaddr's own exceptions never leave this module, so a peer's bad address is a
clear error for the caller to count, never a traceback. Questions about a well-formed address
that is not of the kind asked about (:func:`direct_tcp`) answer None; the filters
(:func:`direct_tcp_endpoints`, :func:`ip_of`, :func:`is_multiaddr`) take anything.
No libp2p here: the config loader and the doctor use it without starting a host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import multiaddr

from protocol.membership.messages import MAX_ADDR_LEN

Addr = str | bytes | multiaddr.Multiaddr
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: protocols that name the host of a TCP endpoint, and those of them that are IP addresses
HOST_PROTOCOLS = ("ip4", "ip6", "dns", "dns4", "dns6")
IP_PROTOCOLS = ("ip4", "ip6")
#: a relayed address: <relay address>/p2p/<relay>/p2p-circuit/p2p/<target>
CIRCUIT = "p2p-circuit"


class AddrError(ValueError):
    """An address that is no multiaddr, or not the kind of multiaddr asked for."""


@dataclass(frozen=True, slots=True)
class TcpEndpoint:
    #: one of HOST_PROTOCOLS
    family: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"/{self.family}/{self.host}/tcp/{self.port}"


def parse(addr: Addr) -> multiaddr.Multiaddr:
    """``addr`` as a Multiaddr: bytes in the binary form, else as UTF-8 text; at most
    ``MAX_ADDR_LEN`` bytes or characters, and not empty."""
    if isinstance(addr, multiaddr.Multiaddr):
        return addr
    if not isinstance(addr, (str, bytes)):
        raise AddrError(f"{addr!r} is not a multiaddr: a {type(addr).__name__}")
    if len(addr) > MAX_ADDR_LEN:
        raise AddrError(f"{_shown(addr)} is longer than {MAX_ADDR_LEN}")
    forms: list[str | bytes] = [addr]
    if isinstance(addr, bytes):
        try:
            forms.append(addr.decode())
        except UnicodeDecodeError:
            pass
    reason = "empty"
    for form in forms:
        if isinstance(form, str) and not form.startswith("/"):
            reason = "its text does not start with /"
            continue
        try:
            parsed = multiaddr.Multiaddr(form)
            str(parsed)  # the binary form is decoded lazily: decode it now, failing here
        except Exception as exc:  # py-multiaddr raises several unrelated types
            reason = str(getattr(exc, "message", None) or exc)  # without the address again
            continue
        if len(parsed):
            return parsed
    raise AddrError(f"{_shown(addr)} is not a multiaddr: {reason}")


def is_multiaddr(addr: Addr) -> bool:
    """Whether :func:`parse` takes ``addr``."""
    try:
        parse(addr)
    except AddrError:
        return False
    return True


def parts(addr: Addr) -> list[tuple[str, str | None]]:
    """``(protocol name, value)`` of each component; value None for one without a value."""
    return [(proto.name, value) for proto, value in parse(addr).items()]


def text(addr: Addr) -> str:
    """The canonical text of ``addr``."""
    return str(parse(addr))


def tcp_endpoint(addr: Addr) -> TcpEndpoint:
    """The ``/<ip4|ip6|dns|dns4|dns6>/<host>/tcp/<port>`` ``addr`` starts with."""
    p = parts(addr)
    if len(p) < 2 or p[0][0] not in HOST_PROTOCOLS or p[1][0] != "tcp":
        raise AddrError(f"{_shown(addr)} is not a /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port> "
                        "multiaddr")
    return TcpEndpoint(p[0][0], str(p[0][1]), int(str(p[1][1])))


def direct_tcp(addr: Addr) -> TcpEndpoint | None:
    """The IP and TCP port of a direct address (``/ip4|ip6/<ip>/tcp/<port>...``, not through a
    relay); None for a relayed, DNS or non-TCP one. What a dial-back or a hole punch dials."""
    p = parts(addr)
    if (len(p) < 2 or p[0][0] not in IP_PROTOCOLS or p[1][0] != "tcp"
            or any(name == CIRCUIT for name, _ in p)):
        return None
    return TcpEndpoint(p[0][0], str(p[0][1]), int(str(p[1][1])))


def direct_tcp_endpoints(addrs: Iterable[Addr]) -> list[TcpEndpoint]:
    """The direct TCP endpoints among ``addrs``, in order, each once: the addresses a dial-back
    or a hole punch may dial. Relayed, DNS and non-TCP addresses are skipped, and so are those
    that are no multiaddr at all (a peer's list is taken for what it holds)."""
    out: list[TcpEndpoint] = []
    for addr in addrs:
        try:
            endpoint = direct_tcp(addr)
        except AddrError:
            continue
        if endpoint is not None and endpoint not in out:
            out.append(endpoint)
    return out


def is_relayed(addr: Addr) -> bool:
    return any(name == CIRCUIT for name, _ in parts(addr))


def ip_of(addr: Addr) -> IpAddress | None:
    """The IP address ``addr`` starts with; None when it starts with another protocol or is
    no multiaddr at all."""
    try:
        name, value = parts(addr)[0]
    except AddrError:
        return None
    return ipaddress.ip_address(str(value)) if name in IP_PROTOCOLS else None


def with_ip(addr: Addr, ip: str) -> str:
    """``addr`` with the IP address it starts with replaced by ``ip`` (of either family)."""
    p = parts(addr)
    if p[0][0] not in IP_PROTOCOLS:
        raise AddrError(f"{_shown(addr)} does not start with an IP address")
    new = ipaddress.ip_address(ip)
    return text(f"/ip{new.version}/{new}" + _joined(p[1:]))


def split_circuit(addr: Addr) -> tuple[str, str, str]:
    """``(relay address ending in /p2p/<relay>, relay, target)`` of
    ``<relay address>/p2p/<relay>/p2p-circuit/p2p/<target>``."""
    p = parts(addr)
    at = next((i for i, (name, _) in enumerate(p) if name == CIRCUIT), -1)
    if at < 1 or p[at - 1][0] != "p2p" or p[at + 1:] != [("p2p", p[-1][1])] or at + 2 != len(p):
        raise AddrError(f"{_shown(addr)} is not a relayed address "
                        "(<relay>/p2p/<id>/p2p-circuit/p2p/<id>)")
    return _joined(p[:at]), str(p[at - 1][1]), str(p[-1][1])


def _joined(p: list[tuple[str, str | None]]) -> str:
    return "".join(f"/{name}" if value is None else f"/{name}/{value}" for name, value in p)


def _shown(addr: Addr) -> str:
    return repr(addr[:MAX_ADDR_LEN] if not isinstance(addr, multiaddr.Multiaddr) else addr)
