"""Doctor checks over the network: bootstrap peers, and what only the running daemon knows.

Bootstrap (``probe_bootstrap``), for each configured address in turn: the host resolves, the
TCP port answers, and a libp2p connection to the named peer id succeeds; then the peer's
``Hello`` (which every node sends on the network-independent handshake protocol as soon as a
connection opens) says which network id it speaks. The probe uses a throwaway identity, sends
no Hello of its own (so the peer never counts it as a member) and disconnects at once.

Running daemon (``reachability_check``, ``nat_check``, ``clock_check``): from ``GET /status``
and ``GET /ledger/peers``. Reachability is what the connections show: peers that dialled in
prove that this node can be reached, and so does a relay reservation (peers dial it through
the relay). The NAT line is AutoNAT's verdict (peers asked to dial this node back: public,
private or not known yet) and the relay reservation held, if any (node/p2p/nat.py).
Clock offset comes from signed capability records: a record's ``issued_at_ms`` against when
this node first held it; a peer whose records arrive "before" they were issued runs ahead of
our clock by at least that much (a clock behind ours is indistinguishable from gossip delay).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

import trio

from node.doctor.report import FAIL, PASS, SKIP, WARN, Check
from node.p2p.multiaddrs import AddrError, TcpEndpoint, direct_tcp_endpoints, tcp_endpoint
from node.transport import TransportError
from protocol.codec import decode
from protocol.errors import InvalidMessage
from protocol.ledger.records import MAX_CLOCK_SKEW_MS
from protocol.membership.messages import Hello
from protocol.names import peer_id_of_multiaddr

#: each step of a bootstrap probe (resolve, TCP, libp2p dial, the peer's Hello) within this long
PROBE_STEP_S = 5.0
#: a peer whose clock runs ahead of ours by more than this gets a warning
CLOCK_WARN_MS = 2_000
NTP_FIX = "keep the clock synchronized: timedatectl set-ntp true (or run chronyd / ntpd)"


async def probe_bootstrap(addr: str, network_id: str, *, step_s: float = PROBE_STEP_S) -> Check:
    name = f"bootstrap {addr}"
    peer = peer_id_of_multiaddr(addr)
    try:
        endpoint = tcp_endpoint(addr)
    except AddrError as exc:
        return Check(name, FAIL, str(exc), "fix 'bootstrap' in node.toml or --bootstrap")
    host, port = endpoint.host, endpoint.port
    if peer is None:
        return Check(name, FAIL, "the address names no peer (/p2p/<peer id>)",
                     "append /p2p/<the peer's id> (its `symphony node status` shows it)")
    try:
        with trio.fail_after(step_s):
            infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    except (OSError, trio.TooSlowError) as exc:
        return Check(name, FAIL, f"{host} does not resolve: {exc!r}",
                     "check the host name, or use the peer's IP address (/ip4/...)")
    family_, _, _, _, sockaddr = infos[0]
    ip = str(sockaddr[0])
    try:
        with trio.socket.socket(family_, trio.socket.SOCK_STREAM) as sock:
            with trio.fail_after(step_s):
                await sock.connect(sockaddr)
    except (OSError, trio.TooSlowError) as exc:
        why = "timed out" if isinstance(exc, trio.TooSlowError) else (exc.strerror or repr(exc))
        return Check(name, FAIL, f"nothing answers at {ip}:{port} ({why})",
                     "check the port (the peer's `symphony node status` lists its addresses) "
                     "and that no firewall drops it")
    return await _ask_network_id(name, addr, peer, network_id, step_s)


async def _ask_network_id(name: str, addr: str, peer: str, network_id: str,
                          step_s: float) -> Check:
    from node.p2p.host import open_p2p
    from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID

    send, hellos = trio.open_memory_channel[Hello](1)  # the first Hello is all we wait for

    async def on_handshake(sender: str, data: bytes) -> bytes:
        try:
            message = decode(data)
        except InvalidMessage:
            return b"invalid message"
        if sender == peer and isinstance(message, Hello):
            try:
                send.send_nowait(message)
            except trio.WouldBlock:
                pass  # a repeated Hello: the first one answered already
        return b""

    async with open_p2p(os.urandom(32), listen=["/ip4/127.0.0.1/tcp/0"],
                        dial_timeout_s=step_s) as transport:
        transport.set_request_handler(HANDSHAKE_PROTOCOL_ID, on_handshake,
                                      max_request_bytes=4096)
        started = trio.current_time()
        try:
            await transport.connect(addr)
        except TransportError as exc:
            return Check(name, FAIL, f"TCP answers but the libp2p dial fails: {exc}",
                         "check the /p2p/ peer id: it must be the peer's own (its `symphony "
                         "node status`); a wrong id fails the Noise handshake")
        connect_ms = round((trio.current_time() - started) * 1000)
        with trio.move_on_after(step_s):
            hello = await hellos.receive()
            await transport.disconnect(peer)
            if hello.network_id != network_id:
                return Check(name, FAIL, f"the peer speaks network id {hello.network_id!r}, "
                             f"ours is {network_id!r}",
                             f"use a bootstrap peer of network {network_id!r}, or join theirs: "
                             f"network_id = {hello.network_id!r}")
            return Check(name, PASS, f"peer {peer[:16]}... answers in {connect_ms} ms, network "
                         f"id {hello.network_id!r}, {hello.agent_version}")
    return Check(name, FAIL, f"connected, but no Hello within {step_s} s: not a symphony node "
                 "(or one too old to say its network id)", "use a symphony node's address")


def _private(endpoint: TcpEndpoint) -> bool:
    ip = ipaddress.ip_address(endpoint.host)
    return ip.is_private or ip.is_loopback or ip.is_link_local


def reachability_check(status: dict[str, Any]) -> Check:
    """Whether peers can dial this node, from its addresses and who dialled in."""
    addrs = list(status.get("addresses", []))
    inbound = [p for p in status.get("peers", []) if p.get("outbound") is False]
    direct = direct_tcp_endpoints(addrs)
    public = [e for e in direct if not _private(e)]
    where = ", ".join(map(str, direct)) or "none"
    relayed = status.get("nat", {}).get("relayed_addrs", [])
    if inbound:
        return Check("reachability", PASS, f"{len(inbound)} peer(s) dialled in; addresses "
                     f"{where}")
    if relayed:
        return Check("reachability", PASS, f"reachable through a relay: {relayed[0]}")
    port = direct[0].port if direct else "<port>"
    detail = (f"no peer has dialled in yet; addresses {where}"
              + ("" if public else " (all private: peers outside this network cannot dial "
                 "them)") + "; no relay reservation")
    return Check("reachability", WARN, detail,
                 f"forward TCP port {port} on the router to this machine and listen on it "
                 "(--listen /ip4/0.0.0.0/tcp/" + str(port) + "), or rely on outbound "
                 "connections only")


def nat_check(status: dict[str, Any]) -> Check:
    """AutoNAT's verdict and the relay reservation held (``status["nat"]``)."""
    nat = status.get("nat") or {}
    if not nat:
        return Check("nat", SKIP, "this daemon runs no NAT traversal",
                     "upgrade the node (AutoNAT and relaying come with it)")
    verdict, answers = nat.get("reachability", "unknown"), nat.get("autonat_answers", {})
    said = f"AutoNAT: {verdict} ({len(answers)} peer(s) answered)"
    serving = nat.get("relay_service", {})
    held = nat.get("reservations", [])
    if verdict == "public":
        relaying = (f"relaying for {serving.get('reservations', 0)} peer(s)"
                    if serving.get("serving") else "not relaying for others")
        return Check("nat", PASS, f"{said}; publicly reachable, {relaying}")
    if held:
        return Check("nat", PASS, f"{said}; relay reservation on {held[0]['relay'][:16]}... "
                     f"for {held[0]['expires_in_s']} s more: peers reach this node through it")
    if verdict == "private":
        return Check("nat", WARN, f"{said}; behind a NAT and no relay reservation: reachable "
                     "only over connections this node opens",
                     "connect to a publicly reachable node (a bootstrap peer) that relays "
                     "([nat] relay_service), or forward the listen port on the router")
    return Check("nat", WARN, f"{said}; no verdict yet: it needs directly connected peers "
                 "to dial this node back", "wait for peers (symphony node status), or add a "
                 "bootstrap peer")


def clock_check(peers: dict[str, Any], rejections: dict[str, dict[str, int]]) -> Check:
    """Clock offset against peers, from their records (``GET /ledger/peers``) and refusals."""
    future = sum(c.get("from_future", 0) for c in rejections.values())
    ahead = {p["peer_id"]: p["issued_at_ms"] - p["last_seen_ms"]
             for p in peers.get("peers", []) if not p.get("self")}
    if future:
        return Check("clock", FAIL, f"{future} record(s) refused as issued more than "
                     f"{MAX_CLOCK_SKEW_MS // 1000} s in our future: our clock or theirs is off",
                     NTP_FIX)
    if not ahead:
        return Check("clock", SKIP, "no peer's record held yet: nothing to compare with",
                     "wait until the node has peers (symphony node status)")
    worst_peer, worst = max(ahead.items(), key=lambda kv: kv[1])
    detail = (f"{len(ahead)} peer(s); the most ahead, {worst_peer[:16]}..., issued its record "
              f"{max(worst, 0)} ms in our future (0: no peer runs ahead of us)")
    if worst > CLOCK_WARN_MS:
        return Check("clock", WARN, detail, NTP_FIX)
    return Check("clock", PASS, detail)
