"""NAT traversal for one host: which of AutoNAT, relay and hole punching runs, and when.

:class:`NatService` owns the four protocols' handlers (served on the guarded host, so every
fault is penalized like any other protocol's) and one loop, ``run``, ticking every
``tick_s`` (NatConfig):

* AutoNAT: with at least one peer connected directly, ask up to
  ``autonat_peers_per_round`` of them to dial us back (node/p2p/autonat.py), at once and
  then every ``autonat_interval_s``; the verdict (public, private, unknown) is the majority
  of the latest answers.
* Relay service (hop, node/p2p/circuit_hop.py): served while ``relay_service`` is "on", or
  "auto" and the verdict is public.
* Relay client (node/p2p/circuit_client.py): while the verdict is private (or always, with
  ``reserve_always``), hold one live reservation on a directly connected peer that relays
  (tried in turn; one that refuses is not asked again for ``REFUSED_BACKOFF_S``), refreshed
  ``REFRESH_BEFORE_S`` before it expires, dropped when the relay disconnects. Our relayed
  addresses join ``listen_addrs()`` (so Hello, capability records and invites carry them).
* Hole punching (node/p2p/dcutr.py): each inbound relayed connection is upgraded to a direct
  one where the NATs allow it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
import trio
from libp2p.peer.id import ID

from node.p2p.autonat import AUTONAT_ID, PUBLIC, AutoNatServer, Reachability, probe
from node.p2p.circuit_client import RelayClient
from node.p2p.circuit_hop import HOP_ID, STOP_ID, RelayService, is_relayed
from node.p2p.dcutr import DCUTR_ID, HolePuncher
from node.p2p.guard import GuardedHost
from node.p2p.invite import dialable_addrs
from node.p2p.multiaddrs import direct_tcp_endpoints, ip_of
from node.p2p.natconfig import NatConfig
from node.transport import TransportError

#: a reservation is refreshed this long before it expires
REFRESH_BEFORE_S = 300.0
#: a peer that refused a reservation (or failed) is not asked again for this long
REFUSED_BACKOFF_S = 60.0
#: a bulk stream waits at most this long for a hole punch in progress to that peer
BULK_WAIT_FOR_DIRECT_S = 10.0
#: how long this machine's addresses (for a 0.0.0.0 listener) are taken as known
EXPAND_EVERY_S = 60.0


class NatService:
    """AutoNAT, relay (both sides) and DCUtR for one host; see the module doc."""

    def __init__(self, guarded: GuardedHost, config: NatConfig, read_deadline_s: float,
                 now_ms: Callable[[], int]) -> None:
        self._guarded = guarded
        self._host = host = guarded.host
        self._swarm = host.get_network()
        self.config = config
        self._deadline_s = read_deadline_s
        self._self = host.get_id().to_base58()
        self.reachability = Reachability()
        #: set (and replaced) when a tick changed our relayed addresses: see relayed_moved
        self._relayed_moved = trio.Event()
        self.server = AutoNatServer(host, config, read_deadline_s, now_ms)
        self.relay = RelayService(host, config, read_deadline_s, self.relaying,
                                  self.public_addrs, now_ms)
        self.client = RelayClient(host, read_deadline_s, self._on_inbound_relayed)
        self.puncher = HolePuncher(host, read_deadline_s, self.candidates,
                                   lambda: self.reachability.status != PUBLIC)
        self._next_probe_at = 0.0
        self._refused: dict[str, float] = {}
        self._expanded: tuple[tuple[str, ...], float, list[str]] = ((), 0.0, [])
        self._log = structlog.get_logger(__name__)

    def install(self) -> None:
        """Serve the protocols the config turns on, each behind the guard."""
        cfg = self.config
        served = [(AUTONAT_ID, self.server.handle, True),  # answering costs little, capped
                  (HOP_ID, self.relay.handle, cfg.relay_service != "off"),
                  (STOP_ID, self.client.handle_stop, cfg.relay_client),
                  (DCUTR_ID, self.puncher.handle, cfg.hole_punch)]
        for protocol, handler, on in served:
            if on:
                self._guarded.serve(str(protocol), handler)

    def relaying(self) -> bool:
        mode = self.config.relay_service
        return mode == "on" or (mode == "auto" and self.reachability.status == PUBLIC)

    def direct_addrs(self) -> list[str]:
        """Our listening TCP addresses, without /p2p/."""
        return [str(e) for e in direct_tcp_endpoints(self._host.get_transport_addrs())]

    def public_addrs(self) -> list[str]:
        """What a reservation tells its holder to reach us by: our direct addresses (a
        0.0.0.0 listener as this machine's addresses), loopback ones only when there is
        nothing else (they reach nobody beyond this machine)."""
        direct = tuple(self.direct_addrs())
        now = time.monotonic()
        if self._expanded[0] != direct or now - self._expanded[1] > EXPAND_EVERY_S:
            # dialable_addrs asks the OS for this machine's addresses: not on every request
            self._expanded = (direct, now, dialable_addrs(direct))
        addrs = [a for a in self._expanded[2] if not _ip_is(a, "is_unspecified")]
        outside = [a for a in addrs if not _ip_is(a, "is_loopback")]
        return [f"{a}/p2p/{self._self}" for a in outside or addrs]

    def candidates(self) -> list[str]:
        """Where a hole punch may reach us: each IP peers saw us at, with each listening
        port (NATs that keep source ports map them so), then our listening addresses."""
        ports = [e.port for e in direct_tcp_endpoints(self.direct_addrs()) if e.family == "ip4"]
        seen: list[str] = []
        manager = getattr(self._host, "_observed_addr_manager", None)
        observed = manager.addrs(min_observers=1) if manager is not None else []
        for addr in observed:
            ip = ip_of(addr)
            if ip is not None and ip.version == 4:
                seen += [f"/ip4/{ip}/tcp/{port}" for port in ports]
        own = [a for a in self.direct_addrs() if not _ip_is(a, "is_unspecified")]
        return list(dict.fromkeys(seen + own))

    def status(self) -> dict[str, Any]:
        now = time.time()
        return {
            "reachability": self.reachability.status,
            "autonat_answers": self.reachability.answers(),
            "relay_service": {"mode": self.config.relay_service, **self.relay.status()},
            "reservations": [{"relay": h.relay, "expires_in_s": round(h.expire - now),
                              "addrs": list(h.addrs)} for h in self.client.live()],
            "relayed_addrs": self.client.relayed_addrs(),
            "relayed_peers": sorted(p.to_base58() for p in list(self._swarm.connections)
                                    if self.relayed_only(p.to_base58())),
            "hole_punch": dict(self.puncher.counts),
            "autonat_served": dict(self.server.answered),
        }

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        relayed = self.client.relayed_addrs()
        while True:
            try:
                await self._tick()
            except (TransportError, trio.TooSlowError) as exc:
                self._log.debug("nat.tick_failed", error=repr(exc)[:200])
            now = self.client.relayed_addrs()
            if now != relayed:  # a reservation made, lost or expired in this tick
                relayed = now
                self._relayed_moved.set()
                self._relayed_moved = trio.Event()
            await trio.sleep(self.config.tick_s)  # rounds and refreshes fall due with time

    async def relayed_moved(self) -> None:
        """Return once a tick has changed our relayed addresses (a reservation made, lost or
        expired): the one moment ``listen_addrs()`` changes after the host started."""
        await self._relayed_moved.wait()

    def _direct_peers(self) -> list[str]:
        out = []
        for peer, conns in list(self._swarm.connections.items()):
            if any(not is_relayed(c) for c in conns):
                out.append(peer.to_base58())
        return out

    async def _tick(self) -> None:
        peers = self._direct_peers()
        if self.config.autonat and peers and time.monotonic() >= self._next_probe_at:
            self._next_probe_at = time.monotonic() + self.config.autonat_interval_s
            await self._probe_round(peers)
        for relay in [h.relay for h in list(self.client.held.values())]:
            if relay not in peers:
                del self.client.held[relay]
                self._log.info("nat.reservation_lost", relay=relay, why="disconnected")
        cfg = self.config
        if cfg.relay_client and (cfg.reserve_always or self.reachability.status == "private"):
            await self._keep_reservation(peers)

    async def _probe_round(self, peers: list[str]) -> None:
        addrs = self.direct_addrs()
        if not addrs:
            return
        asked = sorted(peers, key=lambda p: p in self.reachability.answers())
        asked = asked[:self.config.autonat_peers_per_round]

        async def ask(peer: str) -> None:
            try:
                verdict = await probe(self._host, peer, addrs,
                                      self._deadline_s + self.config.dialback_timeout_s * 4)
            except Exception as exc:  # no AutoNAT there, or it went away: no vote
                self._log.debug("nat.autonat_unanswered", peer=peer, error=repr(exc)[:200])
                return
            if verdict is not None:
                self.reachability.record(peer, verdict)

        before = self.reachability.status
        async with trio.open_nursery() as nursery:
            for peer in asked:
                nursery.start_soon(ask, peer)
        if self.reachability.status != before:
            self._log.info("nat.reachability", status=self.reachability.status,
                           answers=self.reachability.answers())

    async def _keep_reservation(self, peers: list[str]) -> None:
        now = time.time()
        live = [h for h in self.client.live() if h.expire - now > REFRESH_BEFORE_S]
        if live:
            return
        held = list(self.client.held)
        for relay in held + [p for p in peers if p not in held]:
            if self._refused.get(relay, 0.0) > now:
                continue
            try:
                got = await self.client.reserve(relay, self._dialled_addr(relay))
            except Exception as exc:
                self._refused[relay] = now + REFUSED_BACKOFF_S
                self.client.held.pop(relay, None)
                self._log.debug("nat.reservation_refused", relay=relay, error=repr(exc)[:200])
                continue
            self._log.info("nat.reserved", relay=relay, addrs=self.client.relayed_addrs(),
                           expires_in_s=round(got.expire - now))
            return

    def _dialled_addr(self, peer: str) -> str | None:
        """The address we dialled ``peer`` at, kept beside the relay's own addresses in case
        those are not reachable from outside (None when it dialled us)."""
        for conn in self._swarm.get_connections(ID.from_base58(peer)):
            if is_relayed(conn) or "OUTBOUND" not in str(conn.direction).upper():
                continue
            remote = conn.muxed_conn.get_remote_address()
            if remote:
                family = "ip6" if ":" in remote[0] else "ip4"
                return f"/{family}/{remote[0]}/tcp/{remote[1]}/p2p/{peer}"
        return None

    # ---- connections ------------------------------------------------------------------------

    async def _on_inbound_relayed(self, peer: str) -> None:
        if self.config.hole_punch:
            await self.puncher.initiate(peer)

    async def prefer_direct(self, peer: str) -> None:
        """Wait (bounded) for a hole punch to ``peer`` in progress: bulk streams go direct."""
        event = self.puncher.in_progress.get(peer)
        if event is not None:
            with trio.move_on_after(BULK_WAIT_FOR_DIRECT_S):
                await event.wait()

    def relayed_only(self, peer: str) -> bool:
        conns = self._swarm.get_connections(ID.from_base58(peer))
        return bool(conns) and all(is_relayed(c) for c in conns)


def _ip_is(addr: str, kind: str) -> bool:
    """Whether ``addr`` starts with an IP address that ``ipaddress`` says is ``kind``."""
    ip = ip_of(addr)
    return ip is not None and bool(getattr(ip, kind))
