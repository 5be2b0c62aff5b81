"""Chains of real daemons on loopback for `symphony bench distributed`.

:func:`chain_net` starts a requester daemon (no blocks) and one daemon per block range
(``--serve-blocks A:B``, one torch thread each), all with ``[inference] link_delay_ms`` (every
outgoing session frame held that long: an emulated link), waits until the requester's ledger
lists every range, and yields a :class:`ChainNet`. :meth:`ChainNet.generate` posts
``/inference/generate`` to the requester and returns its answer (a refusal raises
:class:`ChainRefused` with the daemon's message). Every daemon is stopped on the way out.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from node.api.app import read_token
from node.testnet import LocalTestnet, NodeProcess, TestnetError, wait_until

#: a generation through a chain of CPU stages on a shared machine can take minutes
GENERATE_TIMEOUT_S = 600.0
#: starting a daemon that loads blocks of the model, on two busy cores
START_TIMEOUT_S = 180.0
#: log lines of each daemon shown with a refused generation
LOG_LINES = 12
#: a graceful stop of a daemon that holds a model, before it is killed
STOP_TIMEOUT_S = 30.0


class ChainRefused(Exception):
    """The requester answered a generation with an error (its message is the text)."""


def split(n_blocks: int, stages: int) -> list[tuple[int, int]]:
    """``stages`` contiguous ranges of nearly equal size covering [0, n_blocks)."""
    bounds = [round(i * n_blocks / stages) for i in range(stages + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(stages)]


@dataclass
class ChainNet:
    net: LocalTestnet
    requester: NodeProcess
    servers: list[tuple[NodeProcess, tuple[int, int]]]

    def generate(self, prompt: str, max_tokens: int, speculative: int = 0,
                 rule: str = "greedy") -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens,
                                "speculative": speculative}
        if speculative:
            body["rule"] = rule
        token = read_token(self.requester.data_dir)
        response = httpx.post(self.requester.api_url + "/inference/generate", json=body,
                              headers={"Authorization": f"Bearer {token}"},
                              timeout=GENERATE_TIMEOUT_S)
        answer: dict[str, Any] = response.json()
        if response.status_code != 200:
            message = str(answer.get("error", {}).get("message", answer))
            raise ChainRefused(f"{message}\n{self.net.log_tails(LOG_LINES)}")
        return answer

    def inference_status(self, node: NodeProcess) -> dict[str, Any]:
        status: dict[str, Any] = httpx.get(node.api_url + "/inference/", timeout=10).json()
        return status


def _offers_cover(requester: NodeProcess, ranges: Sequence[tuple[int, int]]) -> bool:
    status = httpx.get(requester.api_url + "/inference/", timeout=10).json()
    offered = {(int(a), int(b)) for _, a, b in status.get("offers", [])}
    return set(ranges) <= offered


@contextmanager
def chain_net(ranges: Sequence[tuple[int, int]], *, link_delay_ms: float = 0.0,
              name: str = "chain") -> Iterator[ChainNet]:
    """A requester and one daemon per range in ``ranges`` (a range may repeat: a spare)."""
    # membership keeps its default intervals: a peer exchange every 500 ms repeats the same
    # request often enough for the peers' replay rule to ban each other within a minute
    section = {"inference": {"link_delay_ms": link_delay_ms, "threads": 1}}
    with tempfile.TemporaryDirectory(prefix=f"symphony-bench-{name}-") as tmp:
        net = LocalTestnet(Path(tmp), network_id=f"bench-{name}", config=section)
        try:
            requester = net.start("requester", timeout_s=START_TIMEOUT_S)
            servers = []
            for i, (a, b) in enumerate(ranges):
                node = net.start(f"s{i}-{a}-{b}", bootstrap=[requester],
                                 extra_args=["--serve-blocks", f"{a}:{b}"], wait=False)
                servers.append((node, (a, b)))
            for node, _ in servers:
                node.wait_ready(START_TIMEOUT_S)
            wait_until(lambda: _offers_cover(requester, ranges), "the requester sees every range",
                       timeout_s=START_TIMEOUT_S, on_timeout=net.log_tails)
            yield ChainNet(net, requester, servers)
        finally:
            try:
                net.stop_all(timeout_s=STOP_TIMEOUT_S)
            except TestnetError:  # a daemon slow to stop on busy cores: not what is measured
                net.kill_all()


def peak_rss_mb(node: NodeProcess) -> float:
    """The daemon's peak resident memory (VmHWM), MiB; 0 when it cannot be read."""
    if node.proc is None:
        return 0.0
    try:
        for line in Path(f"/proc/{node.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def wait_for_session(chain: ChainNet, node: NodeProcess, forwards: int,
                     timeout_s: float = GENERATE_TIMEOUT_S) -> None:
    """Until ``node`` has an open session that has run at least ``forwards`` forwards."""
    def busy() -> bool:
        status = chain.inference_status(node)
        return bool(status["sessions"] >= 1 and status["forwards"] >= forwards)

    wait_until(busy, f"{node.name} serves a session", timeout_s=timeout_s)


def elapsed(since: float) -> float:
    return round(time.perf_counter() - since, 3)
