"""`symphony bench transport`, discovery phase: how long a daemon takes to reach a peer it
was never told about.

Three real daemons on loopback (node/testnet.py). A hub runs, and C joins it; then B starts
with the hub as its only bootstrap address and finds C through the signed rendezvous records
the hub keeps (protocol/membership/discovery.py: B asks the hub at connect, gets C's record,
and membership dials C). The figure is read from B's own log, as the bootstrap figure is
(node/bench/transport/join.py): from its ``transport.started`` line to its first
``membership.peer_ready`` for C, so it holds the dial to the hub, the query, the answer and the
dial to C. Peer exchange is off in these daemons so that only discovery can introduce B to C
(on a user's node both run, and whichever answers first wins). Median of ``rounds`` runs, each
with a fresh B.

Key: ``first_peer_dht_ms`` (the issue's name for time to first connection via discovery;
the discovery is rendezvous, not a Kademlia DHT: see the protocol module for why).
"""

from __future__ import annotations

import statistics
from typing import Any

from node.bench.transport.join import bench_testnet, first_peer_ms

#: the bench's daemons: default membership timings, no peer exchange, no model
CONFIG: dict[str, Any] = {"executor": {"solver": ""}, "membership": {"peer_exchange": False}}
WAIT_S = 60.0


def discovery_times(rounds: int) -> dict[str, float]:
    with bench_testnet("discovery", "benchfind", CONFIG) as net:
        hub = net.start("hub")
        c = net.start("c", bootstrap=[hub])
        net.wait_until(lambda: hub.status()["services"]["discovery"]["records"] >= 1,
                       "the hub to keep c's record", WAIT_S)
        found = []
        for i in range(rounds):
            b = net.start(f"b{i}", bootstrap=[hub])
            found.append(first_peer_ms(net, b, c))
            b.send_stop()  # stopped with the others at the end: a slow stop is no figure
    return {"first_peer_dht_ms": statistics.median(found)}
