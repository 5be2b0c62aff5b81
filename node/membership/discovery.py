"""The discovery service: drives protocol/membership/discovery.py (signed rendezvous records).

It owns ``Register``, ``DiscoverRequest`` and ``DiscoverResponse`` (on the network's one
unicast protocol, so no new protocol id is served). At start it gives the machine the
addresses this node's own record announces (those mDNS and invites announce), and again
whenever they change (a relay reservation comes or goes): the machine then registers the new
record with every connected peer. Each peer the
machine discovers goes to the membership machine as a known peer (``AddKnown``): membership
dials it while it has fewer than ``target_peers`` connections, and stores it in the peer store
once it is ready. Unverified records never go to the peer store: signed records are cheap to
mint with throwaway keys, and a restarted node must not find its store full of them.

Settings come from the ``[membership]`` section (``discovery``, ``discovery_records_per_peer``,
``discovery_record_ttl_ms``, ``discovery_queries_per_minute``); ``discovery = false`` turns it
off: nothing is sent and what peers send is dropped without blame.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import trio

from node.membership.service import MembershipSection
from node.p2p.invite import dialable_addrs
from node.service import NodeContext, Service
from protocol.membership.discovery import Discovered, Discovery, SetRecordAddrs
from protocol.membership.discovery_messages import (
    DiscoverRequest,
    DiscoverResponse,
    Register,
)
from protocol.membership.machine import AddKnown


class DiscoveryService(Service):
    name: ClassVar[str] = "discovery"
    message_types = (Register, DiscoverRequest, DiscoverResponse)

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        section: MembershipSection = ctx.config.section("membership")
        self._machine = Discovery(
            config=section.discovery_config(ctx.network_id),
            identity=ctx.identity,
            rng=ctx.rng,
            clock_offset_ms=int(time.time() * 1000) - ctx.clock(),
        )

    @property
    def machine(self) -> Discovery:
        return self._machine

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listening = tuple(self.ctx.transport.listen_addrs())
        await self.ctx.submit(self.name, SetRecordAddrs(tuple(dialable_addrs(listening))))
        task_status.started()
        if not self._machine.config.enabled:
            return
        while True:
            listening = tuple(await self.ctx.transport.listen_addrs_changed(listening))
            await self.ctx.submit(self.name, SetRecordAddrs(tuple(dialable_addrs(listening))))

    async def perform(self, effect: object) -> None:
        if isinstance(effect, Discovered):
            await self.ctx.submit("membership", AddKnown(effect.addrs))
            return
        await super().perform(effect)

    def status(self) -> dict[str, Any]:
        m = self._machine
        return {"enabled": m.config.enabled, "records": len(m.table),
                "discovered": m.discovered, "refused": m.refused,
                "queries": m.queries, "queries_pending": len(m.pending)}
