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
import sys
import tempfile
from pathlib import Path
from typing import Any

from node.bench.transport.join import first_peer_ms
from node.testnet import LocalTestnet, TestnetError

#: the bench's daemons: default membership timings, no peer exchange, no model
CONFIG: dict[str, Any] = {"executor": {"solver": ""}, "membership": {"peer_exchange": False}}
WAIT_S = 60.0


def discovery_times(rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="symphony-bench-discovery-") as base:
        net = LocalTestnet(Path(base), network_id="benchfind", config=CONFIG)
        try:
            hub = net.start("hub")
            c = net.start("c", bootstrap=[hub])
            net.wait_until(lambda: hub.status()["services"]["discovery"]["records"] >= 1,
                           "the hub to keep c's record", WAIT_S)
            found = []
            for i in range(rounds):
                b = net.start(f"b{i}", bootstrap=[hub])
                found.append(first_peer_ms(net, b, c))
                b.send_stop()  # stopped with the others at the end: a slow stop is no figure
        finally:
            try:
                net.stop_all()
            except TestnetError as exc:  # the figures stand; say so rather than lose them
                print(f"bench transport: {exc}; killed", file=sys.stderr)
                net.kill_all()
    return {"first_peer_dht_ms": statistics.median(found)}
