"""`symphony bench transport`, relay phase: a first connection through a circuit relay, and
relayed against direct throughput.

First connection (``first_peer_relay_ms``): three real daemons on loopback (node/testnet.py).
R relays (``[nat] relay_service = "on"``); A holds a reservation on R (``reserve_always``: on
loopback AutoNAT rightly calls every node public, so nothing would make A reserve); B starts
with A's relayed address as its only bootstrap address. Read from B's log as the bootstrap
figure is (node/bench/transport/join.py): from ``transport.started`` to the first
``membership.peer_ready`` for A, so it holds B's dial to R, the relay's CONNECT and STOP
exchanges, the Noise and yamux handshakes through the circuit and the Hello exchange. Median
of ``rounds`` runs, each with a fresh B.

Throughput (``relayed_mbps``, ``direct_mbps``, in Mbit/s = 10^6 bit/s, and their ratio
``relayed_vs_direct_ratio``): three transports in this process, B sending ``MiB`` MiB to A
on one bulk stream, first through R (hole punching off, relay limits raised so that only the
relay's own work slows it), then on a direct connection, both in the same run. All three
hosts share this process's one thread, so the relay's copying competes with both ends: on
separate machines the relayed figure would be nearer the direct one.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import trio

from node.bench.transport.join import bench_testnet, first_peer_ms
from node.p2p.host import open_p2p
from node.p2p.natconfig import NatConfig

CONFIG: dict[str, Any] = {"executor": {"solver": ""}}
WAIT_S = 60.0
SINK = "/symphony/bench/relay-sink/1"
CHUNK = 256 * 1024
#: bytes sent each way, full / quick
MIB = {False: 32, True: 8}


def relay_times(rounds: int, quick: bool) -> dict[str, float]:
    figures = {"first_peer_relay_ms": _first_peer_relay_ms(rounds)}
    figures.update(trio.run(throughputs, MIB[quick] << 20))
    return figures


def _first_peer_relay_ms(rounds: int) -> float:
    with bench_testnet("relay", "benchrelay", CONFIG) as net:
        r = net.start("r", config={"nat": {"relay_service": "on"}})
        a = net.start("a", bootstrap=[r], config={"nat": {"reserve_always": True}})
        relayed = net.wait_until(lambda: a.status()["nat"]["relayed_addrs"],
                                 "a to reserve a slot on r", WAIT_S)[0]
        times = []
        for i in range(rounds):
            b = net.start(f"b{i}", bootstrap=[relayed])
            times.append(first_peer_ms(net, b, a))
            b.terminate()
    return statistics.median(times)


async def throughputs(total: int) -> dict[str, float]:
    """Mbit/s of ``total`` bytes from B to A through a circuit relay, then directly, and their
    ratio: three transports in this process (see the module docstring)."""
    wide = NatConfig(relay_service="on", autonat=False, hole_punch=False,
                     circuit_max_bytes=1 << 40, circuit_rate_bytes_per_s=1 << 40)
    quiet = NatConfig(autonat=False, hole_punch=False)
    async with open_p2p(os.urandom(32), nat=wide) as relay, \
            open_p2p(os.urandom(32), nat=quiet) as a, open_p2p(os.urandom(32), nat=quiet) as b:
        async def sink(peer: str, stream: Any) -> None:
            got = 0
            while chunk := await stream.read(1 << 20):
                got += len(chunk)
            await stream.write(got.to_bytes(8, "big"))

        a.set_stream_handler(SINK, sink)
        await a.connect(relay.listen_addrs()[0])
        assert a.nat is not None  # built with a NatConfig just above
        await a.nat.client.reserve(relay.peer_id)
        await b.connect(next(x for x in a.listen_addrs() if "/p2p-circuit" in x))
        relayed = await stream_mb_s(b, a.peer_id, SINK, total) * 8
        await b.connect(a.listen_addrs()[0])  # a direct connection: new streams take it
        direct = await stream_mb_s(b, a.peer_id, SINK, total) * 8
    return {"relayed_mbps": relayed, "direct_mbps": direct,
            "relayed_vs_direct_ratio": relayed / direct}


async def stream_mb_s(sender: Any, peer: str, protocol: str, total: int) -> float:
    """MB/s of ``total`` bytes written on one stream to a sink that answers the count it got."""
    payload = b"\x00" * CHUNK
    started = time.perf_counter()
    stream = await sender.open_stream(peer, protocol)
    for _ in range(total // CHUNK):
        await stream.write(payload)
    await stream.close()
    reply = b""
    while len(reply) < 8:
        chunk = await stream.read(8 - len(reply))
        if not chunk:
            raise RuntimeError("the sink closed before answering")
        reply += chunk
    elapsed = time.perf_counter() - started
    if int.from_bytes(reply, "big") != total:
        raise RuntimeError("the sink counted a different number of bytes")
    return total / elapsed / 1e6
