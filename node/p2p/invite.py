"""Invites: one line that lets another machine join a network through a given node.

``symphony invite`` prints, for the running node, ``symphony-invite-1:`` followed by the
base64url (unpadded) of a signed envelope (crypto/envelope.py, domain ``INVITE_DOMAIN``) whose
payload is the msgpack array ``[1, network_id, [multiaddr, ...], issued_at_ms]``. The signer
is the inviting node; every address must end in ``/p2p/<its peer id>``, so an invite cannot
point a newcomer at someone else under the inviter's name. ``symphony join INVITE`` checks it
(:func:`read_invite`) and uses the addresses as bootstrap peers and the network id as its own.

Addresses: the node's listen addresses, with an unspecified host (``0.0.0.0``) replaced by
this machine's addresses (:func:`dialable_addrs`), plus any the user names (a forwarded port,
a public IP the node cannot see). Loopback addresses only help on the same machine: kept, last.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from crypto.envelope import Envelope, EnvelopeError
from crypto.keys import Identity
from crypto.unpack import Undecodable, unpack_bounded
from node.p2p.multiaddrs import AddrError, ip_of, parse, with_ip
from protocol.membership.messages import MAX_ADDR_LEN, MAX_ADDRS
from protocol.names import check_network_id, peer_id_of_multiaddr

INVITE_PREFIX = "symphony-invite-1:"
INVITE_DOMAIN = "symphony/invite/v1"
INVITE_VERSION = 1
#: the longest invite line accepted (8 addresses of 256 chars, base64: well under this)
MAX_INVITE_CHARS = 4096


class InviteError(ValueError):
    """An invite is malformed, tampered with, or names addresses of another peer."""


@dataclass(frozen=True, slots=True)
class Invite:
    network_id: str
    #: the inviting node's peer id (the signer)
    peer_id: str
    addrs: tuple[str, ...]
    issued_at_ms: int


def make_invite(identity: Identity, network_id: str, addrs: Sequence[str],
                issued_at_ms: int) -> str:
    """The invite line for ``addrs`` (each ending in /p2p/<identity's peer id>)."""
    check_network_id(network_id)
    own = [a for a in addrs if peer_id_of_multiaddr(a) == identity.peer_id]
    if not own:
        raise InviteError(f"no address of {identity.peer_id} to invite to (got {list(addrs)})")
    payload = msgpack.packb([INVITE_VERSION, network_id, own[:MAX_ADDRS], issued_at_ms],
                            use_bin_type=True)
    envelope = Envelope.sign(identity, INVITE_DOMAIN, payload)
    return INVITE_PREFIX + base64.urlsafe_b64encode(envelope.encode()).decode().rstrip("=")


def read_invite(text: str) -> Invite:
    """Check an invite line and return what it says; InviteError naming what is wrong."""
    text = text.strip()
    if len(text) > MAX_INVITE_CHARS:
        raise InviteError(f"an invite is at most {MAX_INVITE_CHARS} characters, got {len(text)}")
    if not text.startswith(INVITE_PREFIX):
        raise InviteError(f"an invite starts with {INVITE_PREFIX!r} (got {text[:24]!r}...)")
    body = text[len(INVITE_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        envelope = Envelope.decode(raw)
        payload = envelope.verify(INVITE_DOMAIN)
    except (ValueError, EnvelopeError) as exc:
        raise InviteError(f"the invite is damaged or was altered: {exc}") from None
    try:
        value = unpack_bounded(payload, max_str=MAX_ADDR_LEN, max_bin=0, max_array=MAX_ADDRS)
    except Undecodable as exc:
        raise InviteError(f"the invite's content is not msgpack: {exc}") from None
    return _checked(value, envelope.signer)


def _checked(value: object, signer: str) -> Invite:
    if not (isinstance(value, tuple) and len(value) == 4 and value[0] == INVITE_VERSION):
        raise InviteError(f"not a version-{INVITE_VERSION} invite [version, network id, "
                          "addresses, issued at]")
    _, network_id, addrs, issued_at_ms = value
    if not isinstance(network_id, str) or type(issued_at_ms) is not int or issued_at_ms < 0:
        raise InviteError("the invite's network id or time has the wrong type")
    try:
        check_network_id(network_id)
    except ValueError as exc:
        raise InviteError(f"the invite's {exc}") from None
    if not isinstance(addrs, tuple) or not addrs or not all(isinstance(a, str) for a in addrs):
        raise InviteError("the invite holds no multiaddr")
    for addr in addrs:
        try:
            parse(addr)
        except AddrError as exc:
            raise InviteError(f"the invite's address {exc}") from None
    foreign = [a for a in addrs if peer_id_of_multiaddr(a) != signer]
    if foreign:
        raise InviteError(f"the invite is signed by {signer} but names addresses of another "
                          f"peer: {foreign}")
    return Invite(network_id=network_id, peer_id=signer, addrs=addrs, issued_at_ms=issued_at_ms)


def dialable_addrs(addrs: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """``extra`` first, then ``addrs`` with an unspecified host replaced by this machine's
    addresses; loopback addresses last (they only reach this machine)."""
    out: list[str] = list(extra)
    for addr in addrs:
        if ip_of(addr) == ipaddress.IPv4Address("0.0.0.0"):
            out += [with_ip(addr, ip) for ip in local_ipv4s()]
        else:
            out.append(addr)
    unique = list(dict.fromkeys(out))
    return sorted(unique, key=_is_loopback)  # stable: the given order within each kind


def _is_loopback(addr: str) -> bool:
    ip = ip_of(addr)
    return ip is not None and ip.is_loopback


def local_ipv4s() -> list[str]:
    """This machine's IPv4 addresses that others may reach: the one its default route leaves
    from (a UDP socket "connected" to a documentation address: no packet is sent), the host
    name's, and loopback last."""
    found: list[str] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            found.append(probe.getsockname()[0])
    except OSError:
        pass  # no default route
    try:
        found += [str(info[4][0]) for info in socket.getaddrinfo(
            socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)]
    except OSError:
        pass
    found.append("127.0.0.1")
    return list(dict.fromkeys(ip for ip in found if ip != "0.0.0.0"))


def node_invite(identity: Identity, network_id: str, listen_addrs: Sequence[str],
                extra: Sequence[str] = (), *, issued_at_ms: int) -> str:
    """The invite of a running node: its listen addresses made dialable, ``extra`` first
    (``/p2p/<peer id>`` appended where missing)."""
    peer = identity.peer_id
    named = [a if peer_id_of_multiaddr(a) else f"{a.rstrip('/')}/p2p/{peer}" for a in extra]
    return make_invite(identity, network_id, dialable_addrs(listen_addrs, named), issued_at_ms)
