"""The membership service: drives protocol/membership/machine.py in the daemon.

It owns the core messages (Hello, Ping/Pong, PeerListRequest/PeerList). At start it tells the
machine this node's dialable addresses and the configured bootstrap peers; from then on the
machine decides whom to dial, ping, ask for peers and drop, and the driver performs it.
Timings come from the ``[membership]`` config section (``SYMPHONY_MEMBERSHIP__<KEY>``), the
target connection count and network id from the top-level config.

``status()`` gives what ``symphony node status`` shows about peers: one entry per connection
(state, latency, addresses, last seen), the recent drops with their reasons, the address book
size.
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any, ClassVar

import trio

from node.p2p.invite import dialable_addrs
from node.p2p.mdns import LanDiscovery
from node.p2p.peerstore import SAVE_INTERVAL_S, PeerStore
from node.p2p.peerstore import SCHEMA as PEER_STORE_SCHEMA
from node.sections import fed_config, tuning
from node.service import NodeContext, Service
from node.transport import agent_version
from protocol.membership.discovery import DiscoveryConfig
from protocol.membership.machine import (
    AddBootstrap,
    AddKnown,
    Membership,
    MembershipConfig,
    SetListenAddrs,
)
from protocol.membership.messages import Hello, PeerList, PeerListRequest, Ping, Pong
from protocol.names import peer_id_of_multiaddr

_FINDING: dict[str, Any] = {f.name: f.default for f in fields(DiscoveryConfig)}


@tuning(MembershipConfig, "hello_timeout_ms", "ping_interval_ms", "unresponsive_after_ms",
        "exchange_interval_ms", "backoff_base_ms", "backoff_max_ms", "refused_backoff_ms",
        "peer_exchange")
class MembershipSection:
    """Tunables of the membership machine (defaults from protocol/membership/machine.py)."""

    #: announce this node and find peers of its network on the LAN by mDNS (node/p2p/mdns.py)
    mdns: bool = True
    #: signed rendezvous records of this network, kept and served by every node
    #: (protocol/membership/discovery.py; node/membership/discovery.py)
    discovery: bool = _FINDING["enabled"]
    #: records one peer may relay into our table (its own registration aside)
    discovery_records_per_peer: int = _FINDING["records_per_peer"]
    #: how long our own signed record holds; we register it again at half of this
    discovery_record_ttl_ms: int = _FINDING["record_ttl_ms"]
    #: discovery queries we send a minute (at most 30: peers take 60 requests a minute)
    discovery_queries_per_minute: int = _FINDING["queries_per_minute"]

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, bool) and value <= 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        try:
            self.discovery_config("check")  # its own range checks
        except ValueError as exc:
            raise ValueError(f"discovery_{exc}") from None  # named as the key is

    def discovery_config(self, network_id: str) -> DiscoveryConfig:
        return DiscoveryConfig(
            network_id=network_id, enabled=self.discovery,
            records_per_peer=self.discovery_records_per_peer,
            record_ttl_ms=self.discovery_record_ttl_ms,
            queries_per_minute=self.discovery_queries_per_minute)


class MembershipService(Service):
    name: ClassVar[str] = "membership"
    message_types = (Hello, Ping, Pong, PeerListRequest, PeerList)
    config_section = MembershipSection
    schema = PEER_STORE_SCHEMA

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        section: MembershipSection = ctx.config.section(self.name)
        self._machine = Membership(
            config=fed_config(
                section,
                network_id=ctx.network_id,
                agent_version=agent_version(),
                target_peers=ctx.config.target_peers,
            ),
            self_peer=ctx.identity.peer_id,
            rng=ctx.rng,
        )
        self.peer_store = PeerStore(ctx.db)
        self.section = section
        self.lan: LanDiscovery | None = None
        #: peers found by mDNS, and why mDNS does not run ("" when it does or is off)
        self.lan_peers: set[str] = set()
        self.lan_problem = ""

    @property
    def machine(self) -> Membership:
        return self._machine

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        addrs = tuple(self.ctx.transport.listen_addrs())
        await self.ctx.submit(self.name, SetListenAddrs(addrs))
        await self.ctx.submit(self.name, AddBootstrap(tuple(self.ctx.config.bootstrap)))
        stored = self.peer_store.load()
        if stored:
            self.ctx.log.info("membership.peer_store_loaded", peers=len(stored))
            await self.ctx.submit(self.name, AddKnown(tuple(a for _, addrs in stored
                                                            for a in addrs)))
        async with trio.open_nursery() as nursery:
            if self.section.mdns:
                nursery.start_soon(self._lan_discovery)
            nursery.start_soon(self._follow_listen_addrs, addrs)
            task_status.started()
            try:
                while True:
                    await trio.sleep(SAVE_INTERVAL_S)
                    self.save_peers()
            finally:
                self.save_peers()  # the peers ready as the node stops

    async def _follow_listen_addrs(self, addrs: tuple[str, ...]) -> None:
        """Our addresses change when a relay reservation comes or goes: peers hear of it."""
        while True:
            addrs = tuple(await self.ctx.transport.listen_addrs_changed(addrs))
            await self.ctx.submit(self.name, SetListenAddrs(addrs))

    async def _lan_discovery(self) -> None:
        """Announce this node by mDNS and hand the peers found to the machine; a LAN without
        multicast costs a warning, never the node."""
        self.lan = lan = LanDiscovery(self.ctx.network_id, self.ctx.identity.peer_id,
                                      dialable_addrs(self.ctx.transport.listen_addrs()))
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(lan.run)
                self.ctx.log.info("membership.mdns_started", service=lan.type)
                async for addrs in lan.found:
                    peer = peer_id_of_multiaddr(addrs[0])
                    if peer not in self.lan_peers:
                        self.lan_peers.add(str(peer))
                        self.ctx.log.info("membership.mdns_found", peer=peer, addrs=list(addrs))
                    await self.ctx.submit(self.name, AddKnown(addrs))
        except OSError as exc:
            self.lan_problem = f"mDNS unavailable: {exc!r}"
            self.ctx.log.warning("membership.mdns_failed", error=repr(exc))

    def save_peers(self) -> int:
        """Store the peers that are ready now (with the addresses they can be dialled at)."""
        book = self._machine.book
        ready = [(p, book[p].addrs) for p in self._machine.ready_peers() if p in book]
        return self.peer_store.save(ready, int(time.time() * 1000)) if ready else 0

    def ready_peers(self) -> list[str]:
        return self._machine.ready_peers()

    def status(self) -> dict[str, Any]:
        m = self._machine
        now = self.ctx.clock()
        peers = []
        for peer, conn in sorted(m.conns.items()):
            known = m.book.get(peer)
            peers.append({
                "peer_id": peer,
                "state": conn.state.value,
                "latency_ms": conn.rtt_ms,
                "addrs": list(known.addrs) if known else [],
                "last_seen_s_ago": round((now - conn.last_seen_ms) / 1000, 3),
                "connected_s": round((now - conn.connected_at_ms) / 1000, 3),
                "outbound": conn.outbound,
                "agent_version": conn.agent_version,
            })
        dropped = [
            {"peer_id": d.peer, "reason": d.reason, "s_ago": round((now - d.at_ms) / 1000, 3)}
            for d in m.dropped
        ]
        return {"peers": peers, "dropped": dropped, "known_peers": len(m.book),
                "stored_peers": self.peer_store.count(), "target_peers": m.config.target_peers,
                "mdns": {"enabled": self.section.mdns, "running": self.lan is not None
                         and not self.lan_problem, "found": len(self.lan_peers),
                         "dropped": self.lan.dropped if self.lan else 0,
                         "problem": self.lan_problem}}
