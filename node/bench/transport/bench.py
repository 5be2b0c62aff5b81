"""`symphony bench transport`: libp2p between two processes on loopback, beside raw TCP.

A child process (``node.bench.transport.peer``) runs one host; this process runs the other and
measures, in one run:

* stream throughput of one yamux stream (Noise-encrypted) for a ``stream_mib`` MiB transfer,
  and raw trio TCP sockets moving the same bytes to the same child: both in MB/s (10^6 B/s)
  and their ratio (the figure to compare across machines);
* request/response round trips (64-byte echo, sequential): p50 / p99 in ms;
* gossipsub at a paced rate: delivery ratio and latency p50 / p99 in ms, sender's publish
  call to the child's subscription (CLOCK_MONOTONIC is shared across processes);
* a daemon's time to its first ready peer, through a bootstrap address and from its peer
  store after a restart (node/bench/transport/join.py), and to a peer it was never told of,
  found through a third node's rendezvous records (node/bench/transport/discovery.py);
* the first connection through a circuit relay, and relayed against direct throughput
  (node/bench/transport/circuit.py).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import structlog
import trio

from node.bench.transport.circuit import relay_times, stream_mb_s
from node.bench.transport.discovery import discovery_times
from node.bench.transport.join import join_times
from node.p2p.host import P2PTransport

PREFIX = "/symphony/bench/transport"
CHUNK = 256 * 1024
#: (stream MiB, request round trips, gossip messages, gossip messages per second)
FULL = (64, 1000, 500, 50)
QUICK = (16, 200, 100, 50)
#: daemons started to time the first connection (node/bench/transport/join.py), full / quick
JOIN_ROUNDS = {False: 3, True: 1}
#: After the last publish, wait at most this long for stragglers before counting losses.
GOSSIP_DRAIN_S = 3.0


def run(quick: bool) -> dict[str, Any]:
    if not structlog.is_configured():  # keep stdout for the figures (--json)
        structlog.configure(
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        )
    figures: dict[str, Any] = trio.run(_bench, QUICK if quick else FULL)
    figures.update(join_times(JOIN_ROUNDS[quick]))
    figures.update(discovery_times(JOIN_ROUNDS[quick]))
    figures.update(relay_times(JOIN_ROUNDS[quick], quick))
    return figures


async def _bench(sizes: tuple[int, int, int, int]) -> dict[str, Any]:
    stream_mib, round_trips, gossip_n, gossip_rate = sizes
    figures: dict[str, Any] = {"stream_mib": stream_mib}
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "node.bench.transport.peer", PREFIX],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(30):
            peer = json.loads(await _read_line(process.stdout))
        transport = P2PTransport(os.urandom(32))
        async with trio.open_nursery() as nursery:
            await nursery.start(transport.run)
            started = time.perf_counter()
            await transport.connect(peer["addr"])
            figures["connect_ms"] = (time.perf_counter() - started) * 1e3
            total = stream_mib * 1024 * 1024
            figures["tcp_mb_s"] = await _tcp_throughput(peer["tcp_port"], total)
            figures["stream_mb_s"] = await stream_mb_s(transport, peer["peer_id"], f"{PREFIX}/sink/1",
                                                      total)
            figures["stream_vs_tcp_ratio"] = figures["stream_mb_s"] / figures["tcp_mb_s"]
            figures.update(await _round_trips(transport, peer["peer_id"], round_trips))
            figures.update(await _gossip(transport, peer["peer_id"], gossip_n, gossip_rate))
            transport.stop()
    finally:
        with trio.CancelScope(shield=True):
            process.kill()
            await process.wait()
    return figures


async def _read_line(stream: trio.abc.ReceiveStream) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            raise RuntimeError("the transport peer exited before reporting its address")
        line += chunk
    return line


async def _tcp_throughput(port: int, total: int) -> float:
    payload = b"\x00" * CHUNK
    started = time.perf_counter()
    conn = await trio.open_tcp_stream("127.0.0.1", port)
    for _ in range(total // CHUNK):
        await conn.send_all(payload)
    await conn.send_eof()
    reply = b""
    while len(reply) < 8:
        reply += await conn.receive_some(8 - len(reply))
    elapsed = time.perf_counter() - started
    await conn.aclose()
    if int.from_bytes(reply, "big") != total:
        raise RuntimeError("raw TCP sink counted a different number of bytes")
    return total / elapsed / 1e6


async def _round_trips(transport: P2PTransport, peer: str, n: int) -> dict[str, float]:
    samples = []
    for i in range(n + 5):
        started = time.perf_counter()
        reply = await transport.request(peer, f"{PREFIX}/echo/1", b"x" * 64, max_response_bytes=64)
        if i >= 5:  # the first few pay for identify and protocol negotiation caches
            samples.append((time.perf_counter() - started) * 1e3)
        if reply != b"x" * 64:
            raise RuntimeError("echo answered something else")
    return {"rr_p50_ms": _quantile(samples, 0.5), "rr_p99_ms": _quantile(samples, 0.99)}


async def _gossip(transport: P2PTransport, peer: str, n: int, rate: int) -> dict[str, float]:
    topic = f"{PREFIX}/gossip"
    own = await transport.subscribe(topic)  # joining the topic builds the mesh to the child
    with trio.fail_after(10):
        await transport.wait_topic_peer(topic, peer)
    started = trio.current_time()
    for i in range(n):
        await trio.sleep_until(started + i / rate)
        await transport.publish(topic, time.monotonic_ns().to_bytes(8, "big") + b"g" * 56)
    latencies: list[int] = []
    with trio.move_on_after(GOSSIP_DRAIN_S):
        while True:
            raw = await transport.request(peer, f"{PREFIX}/stats/1", b"", max_response_bytes=1 << 24)
            latencies = json.loads(raw)["latencies_ns"]
            if len(latencies) >= n:
                break
            await trio.sleep(0.05)  # polling a remote process: there is no event to wait on
    await own.aclose()
    ms = [x / 1e6 for x in latencies]
    return {
        "gossip_rate_per_s": float(rate),
        "gossip_sent": float(n),
        "gossip_delivery_ratio": len(latencies) / n,
        "gossip_p50_ms": _quantile(ms, 0.5) if ms else float("nan"),
        "gossip_p99_ms": _quantile(ms, 0.99) if ms else float("nan"),
    }


def _quantile(samples: list[float], q: float) -> float:
    if len(samples) < 2:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[round(q * 100) - 1]
