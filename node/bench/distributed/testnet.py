"""One set of real daemons on loopback for `symphony bench distributed`.

:func:`chain_testnet` starts block servers (``--serve-blocks A:B``, one torch thread each)
and requester daemons (no blocks), all at once: every daemon's key is made before it starts, so
each requester's ``[inference] avoid_peers`` can name the servers it must not use (that is
how one set of servers serves both the 2-stage and the 4-stage chains), and its
``link_delay_ms`` makes its chains emulate slow links (the servers hold that session's frames
too) while the others run at loopback speed. The first requester is the bootstrap peer of the
rest. :meth:`ChainTestnet.wait` waits until every daemon is up and each requester's ledger
lists the ranges it needs; :meth:`ChainTestnet.generate` posts ``/inference/generate`` to a
requester and returns its answer (a refusal raises :class:`ChainRefused` with the daemon's message). Every
daemon is stopped on the way out. With a ``link`` spec every daemon runs behind that link.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from crypto.keys import Identity, save_identity
from node.api.token import read_token
from node.testnet import LocalTestnet, NodeProcess, TestnetError, wait_until

#: a generation through a chain of CPU stages on a shared machine can take minutes
GENERATE_TIMEOUT_S = 600.0
#: starting daemons that load blocks of the model, all at once on shared cores
START_TIMEOUT_S = 300.0
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


@dataclass(frozen=True)
class RequesterSpec:
    """A requester daemon: the servers it may use, its links' delay, how its chains run."""

    uses: tuple[str, ...]
    link_delay_ms: float = 0.0
    forwarding: bool = True


@dataclass
class ChainTestnet:
    net: LocalTestnet
    servers: dict[str, tuple[NodeProcess, tuple[int, int]]]
    requesters: dict[str, NodeProcess]
    specs: dict[str, RequesterSpec] = field(default_factory=dict)

    def wait(self) -> None:
        for node in [*self.requesters.values(), *(n for n, _ in self.servers.values())]:
            node.wait_ready(START_TIMEOUT_S)
        for name, spec in self.specs.items():
            needed = {self.servers[s][1] for s in spec.uses}
            wait_until(_covered(self.requesters[name], needed),
                       f"{name} sees every range it uses", timeout_s=START_TIMEOUT_S,
                       on_timeout=self.net.log_tails)

    def generate(self, requester: str, prompt: str, max_tokens: int, speculative: int = 0,
                 rule: str = "greedy") -> dict[str, Any]:
        node = self.requesters[requester]
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens,
                                "speculative": speculative}
        if speculative:
            body["rule"] = rule
        token = read_token(node.data_dir)
        response = httpx.post(node.api_url + "/inference/generate", json=body,
                              headers={"Authorization": f"Bearer {token}"},
                              timeout=GENERATE_TIMEOUT_S)
        answer: dict[str, Any] = response.json()
        if response.status_code != 200:
            message = str(answer.get("error", {}).get("message", answer))
            raise ChainRefused(f"{message}\n{self.net.log_tails(LOG_LINES)}")
        return answer

    @staticmethod
    def inference_status(node: NodeProcess) -> dict[str, Any]:
        status: dict[str, Any] = httpx.get(node.api_url + "/inference/", timeout=10).json()
        return status


def _covered(requester: NodeProcess, ranges: set[tuple[int, int]]) -> Callable[[], bool]:
    """Whether ``requester``'s ledger offers every range of ``ranges``."""
    def check() -> bool:
        status = httpx.get(requester.api_url + "/inference/", timeout=10).json()
        return ranges <= {(int(a), int(b)) for _, a, b in status.get("offers", [])}

    return check


def _keyed(base: Path, name: str) -> str:
    """Make node ``name``'s key before it starts; its peer id."""
    identity = Identity.generate()
    (base / name).mkdir(parents=True, exist_ok=True)
    save_identity(identity, base / name / "node.key")
    return identity.peer_id


@contextmanager
def chain_testnet(servers: Mapping[str, tuple[int, int]],
                  requesters: Mapping[str, RequesterSpec], *,
                  name: str = "distributed", link: str = "",
                  inference: Mapping[str, Any] | None = None,
                  server_inference: Mapping[str, Any] | None = None) -> Iterator[ChainTestnet]:
    """Start every daemon (not waiting: call :meth:`ChainTestnet.wait`), stop them all after.
    ``inference`` is added to every daemon's ``[inference]`` section (e.g. the model),
    ``server_inference`` to the block servers' only (e.g. ``device = "cuda:0"``)."""
    with tempfile.TemporaryDirectory(prefix=f"symphony-bench-{name}-") as tmp:
        base = Path(tmp)
        # membership keeps its default intervals: a peer exchange every 500 ms repeats the same
        # request often enough for the peers' replay rule to ban each other within a minute
        common = {"threads": 1, **(inference or {})}
        net = LocalTestnet(base, network_id=f"bench-{name}", config={"inference": common},
                           link=link)
        ids = {s: _keyed(base, s) for s in servers}
        try:
            started: dict[str, NodeProcess] = {}
            hub: Sequence[NodeProcess] = ()
            for r, spec in requesters.items():
                avoid = [ids[s] for s in servers if s not in spec.uses]
                config = {"inference": {**common, "avoid_peers": avoid,
                                        "forwarding": spec.forwarding,
                                        "link_delay_ms": spec.link_delay_ms}}
                started[r] = net.start(r, bootstrap=hub, config=config, wait=not hub,
                                       timeout_s=START_TIMEOUT_S)
                hub = hub or [started[r]]
            served = {"inference": {**common, **(server_inference or {})}}
            placed = {s: (net.start(s, bootstrap=hub, wait=False, config=served,
                                    extra_args=["--serve-blocks", f"{a}:{b}"]), (a, b))
                      for s, (a, b) in servers.items()}
            yield ChainTestnet(net, placed, started, dict(requesters))
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


def wait_for_session(chain: ChainTestnet, node: NodeProcess, forwards: int,
                     timeout_s: float = GENERATE_TIMEOUT_S) -> None:
    """Until ``node`` has an open session that has run at least ``forwards`` forwards."""
    def busy() -> bool:
        status = chain.inference_status(node)
        return bool(status["sessions"] >= 1 and status["forwards"] >= forwards)

    wait_until(busy, f"{node.name} serves a session", timeout_s=timeout_s)


def elapsed(since: float) -> float:
    return round(time.perf_counter() - since, 3)
