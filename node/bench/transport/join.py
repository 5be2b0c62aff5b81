"""`symphony bench transport`, joining phase: how long a daemon takes to its first ready peer.

Two real daemons on loopback (node/testnet.py). A runs; B starts with A as its bootstrap
address, then B is restarted with no bootstrap at all and finds A again from its peer store.
Each figure is read from B's own log: from its ``transport.started`` line (listening, before
the membership service dials anyone) to its first ``membership.peer_ready`` line for A
(process start-up and imports are not counted; loading the peer store or the bootstrap list,
the dial, the Noise and yamux handshakes and the Hello exchange are). Median of ``rounds`` runs.

Keys: ``first_peer_bootstrap_ms``, ``first_peer_peer_store_ms``. Discovery is timed beside
them (node/bench/transport/discovery.py, ``first_peer_dht_ms``), and so is a first connection
through a relay (node/bench/transport/circuit.py, ``first_peer_relay_ms``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from node.testnet import LocalTestnet, NodeProcess, TestnetError

#: membership timings of the bench's daemons: the defaults (what a user's node does)
CONFIG: dict[str, Any] = {"executor": {"solver": ""}}
WAIT_S = 60.0


def join_times(rounds: int) -> dict[str, float]:
    with bench_testnet("join", "benchjoin", CONFIG) as net:
        a = net.start("a")
        boot, stored = [], []
        for i in range(rounds):
            b = net.start(f"b{i}", bootstrap=[a])
            boot.append(first_peer_ms(net, b, a))
            b.terminate()
            b.args = [x for x in b.args if x != a.addresses[0] and x != "--bootstrap"]
            b.spawn().wait_ready()
            stored.append(first_peer_ms(net, b, a))
            b.terminate()
    return {"first_peer_bootstrap_ms": statistics.median(boot),
            "first_peer_peer_store_ms": statistics.median(stored)}


@contextmanager
def bench_testnet(name: str, network_id: str, config: dict[str, Any]) -> Iterator[LocalTestnet]:
    """A testnet of the transport benches' daemons in a fresh temporary folder, stopped at the
    end (killed when a stop fails: the figures stand, so say so rather than lose them)."""
    with tempfile.TemporaryDirectory(prefix=f"symphony-bench-{name}-") as base:
        net = LocalTestnet(Path(base), network_id=network_id, config=config)
        try:
            yield net
        finally:
            try:
                net.stop_all()
            except TestnetError as exc:
                print(f"bench transport: {exc}; killed", file=sys.stderr)
                net.kill_all()


def first_peer_ms(net: LocalTestnet, b: NodeProcess, a: NodeProcess) -> float:
    """From B's latest ``transport.started`` to its first ``membership.peer_ready`` for A."""

    def measured() -> float | None:
        ready = b.log_events("transport.started")[-1]["timestamp"]
        for event in b.log_events("membership.peer_ready"):
            if event["peer"] == a.peer_id and event["timestamp"] >= ready:
                # at least a microsecond: 0.0 would read as "not yet" to wait_until
                return max((_at(event["timestamp"]) - _at(ready)) * 1000, 1e-3)
        return None

    return float(net.wait_until(measured, f"{b.name} to reach {a.name}", WAIT_S))


def _at(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
