"""`symphony bench relay`: the pipelined weight relay across real daemons on loopback.

One testnet of real daemons (``symphony node run`` processes, node/testnet.py): a publisher and
``peers`` receivers. Every phase publishes a fresh random artifact (so no peer already holds its
chunks) and times from the publish call's return (the manifest is out; importing the file into
the store is timed apart as ``import_s``) until every recipient reports the version complete:

* ``single_s``: one point-to-point transfer (the manifest names one recipient);
* ``relay_s``: every peer at once through the relay plan; ``ratio_vs_single`` = relay/single
  (the goal: about 1, "S/B plus a few chunk times"; target under 1.5);
* ``sequential_s``: the publisher sending to one peer after another (``peers`` single
  transfers); ``ratio_vs_sequential`` = relay/sequential (ideally 1/peers);
* the same three with every node's uplink capped at ``cap_mbps`` (``POST /relay/limits``, a
  token bucket over all of a node's chunk streams), so the figures are about the protocol and
  not about loopback memory copies on a shared CPU (``capped_*``);
* a chunk-size sweep of the capped relay (``capped_sweep_<KiB>k_s``);
* peak resident memory per daemon (``VmHWM``), max and mean, in MiB, and the most any daemon
  grew over its idle size (``peak_rss_over_idle_max_mib``: what relaying cost in memory).

``--link SPEC`` runs every daemon behind that link (node/p2p/link.py; ``link`` echoes it): every
chunk stream crosses it, under the ``capped_`` phases' uplink cap too.

Eight daemons on one machine compete for its CPU, so where cores are few the uncapped ratios
mostly measure CPU contention; the capped ratios are the protocol's.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from node.api.token import read_token
from node.testnet import FAST_MEMBERSHIP, LocalTestnet, NodeProcess

#: (peers, artifact MiB, capped artifact MiB, uplink cap MB/s, chunk KiB, swept chunk KiB).
#: The cap is low because the eight daemons share the machine's cores: above a few MB/s per
#: node the relay is CPU-bound (Noise and yamux run in Python, on both sides of each link).
FULL = (7, 256, 64, 5, 1024, (256, 1024, 4096))
QUICK = (3, 16, 8, 4, 256, (256, 1024))
#: bound on one phase
PHASE_TIMEOUT_S = 600.0
#: bound on a daemon's start (it loads its model first): on cores the other daemons share,
#: longer than the testnet's default minute
START_TIMEOUT_S = 300.0
POLL_S = 0.1
#: every this many polls of the publisher, the recipients still missing are asked directly
DIRECT_POLL_EVERY = 20
MB = 1_000_000


def run(quick: bool, link: str = "") -> dict[str, Any]:
    peers, mib, capped_mib, cap_mbps, chunk_kib, sweep = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="symphony-bench-relay-") as tmp:
        base = Path(tmp)
        net = LocalTestnet(base / "net", network_id="benchrelay", config=FAST_MEMBERSHIP,
                           link=link)
        try:
            pub = net.start("pub", timeout_s=START_TIMEOUT_S)
            others = [net.start(f"p{i}", bootstrap=[pub], wait=False) for i in range(peers)]
            for node in others:
                node.wait_ready(START_TIMEOUT_S)
            net.wait_all_connected(120)
            idle = [_rss_mib(n, "VmRSS") for n in [pub, *others]]
            bench = _Bench(pub, others, base, mib << 20)
            figures: dict[str, Any] = {
                "link": link,
                "peers": peers,
                "artifact_mib": mib,
                "capped_artifact_mib": capped_mib,
                "cap_mbps": cap_mbps,
                "chunk_kib": chunk_kib,
            }
            figures.update(bench.phases("", chunk_kib << 10))
            bench.set_cap(cap_mbps * MB)
            bench.size = capped_mib << 20
            figures.update(bench.phases("capped_", chunk_kib << 10))
            for kib in sweep:
                figures[f"capped_sweep_{kib}k_s"] = round(bench.relay(kib << 10), 3)
            rss = [_rss_mib(n, "VmHWM") for n in [pub, *others]]
            figures["peak_rss_max_mib"] = max(rss)
            figures["peak_rss_mean_mib"] = round(sum(rss) / len(rss), 1)
            # what relaying added on top of an idle daemon (its models, libp2p, ...)
            figures["peak_rss_over_idle_max_mib"] = round(
                max(r - i for r, i in zip(rss, idle, strict=True)), 1
            )
            return figures
        finally:
            net.kill_all()


class _Bench:
    def __init__(self, pub: NodeProcess, peers: list[NodeProcess], base: Path, size: int) -> None:
        self.pub, self.peers, self.base, self.size = pub, peers, base, size
        self.token = read_token(pub.data_dir)
        self.seq = 0
        self.import_s: list[float] = []

    def phases(self, prefix: str, chunk: int) -> dict[str, float]:
        single = self.transfer([self.peers[0]], chunk)
        relay = self.relay(chunk)
        sequential = sum(self.transfer([p], chunk) for p in self.peers)
        return {
            f"{prefix}single_s": round(single, 3),
            f"{prefix}relay_s": round(relay, 3),
            f"{prefix}sequential_s": round(sequential, 3),
            f"{prefix}ratio_vs_single": round(relay / single, 3),
            f"{prefix}ratio_vs_sequential": round(relay / sequential, 3),
            f"{prefix}relay_mbps": round(self.size / relay / MB, 2),
            f"{prefix}import_s": round(max(self.import_s), 3),
        }

    def relay(self, chunk: int) -> float:
        return self.transfer(self.peers, chunk)

    def set_cap(self, bps: int) -> None:
        for node in [self.pub, *self.peers]:
            response = httpx.post(
                node.api_url + "/relay/limits",
                json={"upload_limit_bps": bps, "upload_bps": bps},
                headers={"Authorization": f"Bearer {read_token(node.data_dir)}"},
                timeout=10,
            )
            response.raise_for_status()

    def transfer(self, recipients: list[NodeProcess], chunk: int) -> float:
        """Publish a fresh artifact to ``recipients``; seconds until all hold it."""
        self.seq += 1
        path = self.base / f"artifact-{self.seq}.bin"
        rng = random.Random(self.seq)
        with open(path, "wb") as f:
            for _ in range(0, self.size, 1 << 20):
                f.write(rng.randbytes(min(1 << 20, self.size - f.tell())))
        started = time.perf_counter()
        response = httpx.post(
            self.pub.api_url + "/relay/publish",
            json={
                "path": str(path),
                "name": "bench",
                "chunk_size": chunk,
                "recipients": [n.peer_id for n in recipients],
            },
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=PHASE_TIMEOUT_S,
        )
        response.raise_for_status()
        published = time.perf_counter()
        self.import_s.append(published - started)
        answer = response.json()
        version, manifest_id, chunks = answer["version"], answer["id"], answer["chunks"]
        waiting = {n.peer_id: n for n in recipients}
        deadline = published + PHASE_TIMEOUT_S
        polls = 0
        while waiting:
            # The publisher hears every recipient's progress reports: polling it alone keeps
            # the benchmark's own load off the daemons; each recipient is asked directly now
            # and then, in case its completion report was lost.
            status = httpx.get(self.pub.api_url + "/relay/status", timeout=10).json()
            mine = [v for v in status["versions"] if v["id"] == manifest_id]
            heard = mine[0]["peers"] if mine else {}
            for peer_id in [p for p in waiting if heard.get(p, 0) >= chunks]:
                del waiting[peer_id]
            polls += 1
            if polls % DIRECT_POLL_EVERY == 0:
                for peer_id, node in list(waiting.items()):
                    st = httpx.get(node.api_url + "/relay/status", timeout=10).json()
                    if any(
                        v["id"] == manifest_id and v["state"] == "complete" for v in st["versions"]
                    ):
                        del waiting[peer_id]
            if time.perf_counter() > deadline:
                raise TimeoutError(f"relay of version {version} did not complete in time")
            if waiting:
                time.sleep(POLL_S)
        elapsed = time.perf_counter() - published
        path.unlink()
        return elapsed


def _rss_mib(node: NodeProcess, field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of a daemon, from /proc, in MiB."""
    assert node.proc is not None  # started by this benchmark
    for line in Path(f"/proc/{node.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0
