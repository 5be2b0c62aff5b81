"""Peers on the same LAN, found by multicast DNS (on by default; ``[membership] mdns = false``
turns it off).

Each node registers one DNS-SD service whose type names its network, ``_sym-<8 hex>._udp``
(a hash of the network id: DNS-SD service types are at most 15 characters), with one TXT entry
``dnsaddr=<multiaddr>`` per dialable address (each ending in ``/p2p/<peer id>``), and browses
that type. A peer found this way is handed to the membership machine as a known peer
(``AddKnown``) and dialled like any other; the Hello exchange still refuses another network,
so a hash collision cannot mix networks.

py-libp2p 0.8.1 ships ``libp2p.discovery.mdns.MDNSDiscovery`` over the same zeroconf library,
but it reports discoveries through a process-global emitter
(``libp2p.discovery.events.peerDiscovery``), so several hosts in one process (tests, the
benchmarks) each receive every host's discoveries, and it writes found addresses straight
into the libp2p peerstore rather than to our membership machine. We drive zeroconf directly
here instead. Its callbacks run on zeroconf's own thread; found addresses cross into trio
through the run's token, onto a bounded channel, dropped (and counted) when it is full.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence
from typing import Any

import trio

from node.p2p.multiaddrs import direct_tcp_endpoints, is_multiaddr
from protocol.membership.messages import MAX_ADDRS
from protocol.names import peer_id_of_multiaddr

#: discoveries waiting for the membership service (it drains them at once; a burst of a whole
#: LAN announcing itself at start fits)
FOUND_BUFFER = 256
#: how long zeroconf may wait for the details of one found service
SERVICE_INFO_TIMEOUT_MS = 3000
TXT_KEY = b"dnsaddr"


def service_type(network_id: str) -> str:
    """The DNS-SD service type of ``network_id``'s nodes."""
    digest = hashlib.blake2b(network_id.encode(), digest_size=4).hexdigest()
    return f"_sym-{digest}._udp.local."


class LanDiscovery:
    """Announce this node on the LAN and report other nodes of its network (see module doc)."""

    def __init__(self, network_id: str, peer_id: str, addrs: Sequence[str]) -> None:
        self.type = service_type(network_id)
        self.peer_id = peer_id
        self.addrs = [a for a in addrs if peer_id_of_multiaddr(a) == peer_id][:MAX_ADDRS]
        self.dropped = 0
        self._send, self.found = trio.open_memory_channel[tuple[str, ...]](FOUND_BUFFER)
        self._zc: Any = None
        self._info: Any = None
        self._browser: Any = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register and browse until cancelled; then unregister (bounded, in a thread)."""
        from zeroconf import ServiceBrowser, ServiceInfo, Zeroconf

        token = trio.lowlevel.current_trio_token()
        ports = [e.port for e in direct_tcp_endpoints(self.addrs)]
        self._info = ServiceInfo(
            self.type, f"{self.peer_id[-40:]}.{self.type}", port=ports[0] if ports else 0,
            addresses=[socket.inet_aton(ip) for ip in _ipv4s(self.addrs)],
            properties=txt_record(self.addrs))
        self._zc = await trio.to_thread.run_sync(Zeroconf)
        try:
            await trio.to_thread.run_sync(self._zc.register_service, self._info)
            self._browser = ServiceBrowser(self._zc, self.type,
                                           handlers=[self._handler(token)])
            task_status.started()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close)

    def _handler(self, token: trio.lowlevel.TrioToken) -> Any:
        from zeroconf import ServiceStateChange

        def on_change(zeroconf: Any, service_type: str, name: str,
                      state_change: Any) -> None:  # on zeroconf's thread
            if state_change is not ServiceStateChange.Added or name == self._info.name:
                return
            info = zeroconf.get_service_info(service_type, name,
                                             timeout=SERVICE_INFO_TIMEOUT_MS)
            addrs = parse_txt(info.text if info is not None and info.text else b"")
            if addrs and peer_id_of_multiaddr(addrs[0]) != self.peer_id:
                try:
                    token.run_sync_soon(self._deliver, addrs)
                except trio.RunFinishedError:
                    pass  # the node stopped meanwhile

        return on_change

    def _deliver(self, addrs: tuple[str, ...]) -> None:
        try:
            self._send.send_nowait(addrs)
        except trio.WouldBlock:
            self.dropped += 1

    def _close(self) -> None:
        if self._browser is not None:
            self._browser.cancel()
        if self._zc is not None:
            try:
                self._zc.unregister_service(self._info)
            finally:
                self._zc.close()


def txt_record(addrs: Sequence[str]) -> bytes:
    """The raw TXT record: one ``dnsaddr=<multiaddr>`` string per address (DNS-SD strings
    are length-prefixed, at most 255 bytes: a longer address is left out)."""
    entries = [TXT_KEY + b"=" + a.encode() for a in addrs]
    return b"".join(bytes([len(e)]) + e for e in entries if len(e) <= 255)


def parse_txt(raw: bytes) -> tuple[str, ...]:
    """The addresses of one peer from a raw TXT record (see :func:`txt_record`); entries that
    are not ``dnsaddr``, not multiaddrs of one peer id, or cut short are skipped."""
    out, i = [], 0
    while i < len(raw):
        size = raw[i]
        entry = raw[i + 1:i + 1 + size]
        i += 1 + size
        key, sep, value = entry.partition(b"=")
        if sep and key == TXT_KEY and len(entry) == size:
            out.append(value.decode("utf-8", "replace"))
    return _one_peer(out)


def _one_peer(addrs: list[str]) -> tuple[str, ...]:
    ok = [a for a in addrs if is_multiaddr(a) and peer_id_of_multiaddr(a)]
    if not ok:
        return ()
    peer = peer_id_of_multiaddr(ok[0])
    return tuple(a for a in ok if peer_id_of_multiaddr(a) == peer)[:MAX_ADDRS]


def _ipv4s(addrs: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(e.host for e in direct_tcp_endpoints(addrs) if e.family == "ip4"))
