"""Shared helpers for node tests that run real daemons as separate processes.

Fixtures
--------
``testnet``: a :class:`node.testnet.LocalTestnet` under this test's tmp dir, network id
``itest``, membership timings shortened (``FAST_MEMBERSHIP``, node/testnet.py) so discovery takes seconds, and
no model (``NO_MODEL``: ``[executor] solver = ""``; a plain node serves the default model,
which test daemons that do not execute skip). A test that needs executors passes
``config={"executor": {"solver": ARITH_SOLVER}}`` (tests/node/arith_solver.py, deterministic
and instant) or ``"models"`` for the real one.
Every node it starts is killed at teardown; if the test failed, the last log lines of every
node are printed (pytest shows them under "Captured stdout teardown").

    def test_five_nodes(testnet):
        nodes = testnet.start_many(["a", "b", "c", "d", "e"])   # b..e bootstrap from a
        testnet.wait_all_connected()
        st = nodes[1].status()                 # GET /status of node b
        nodes[2].kill()                        # kill -9
        nodes[2].restart()                     # same data dir -> same peer id
        testnet.wait_until(lambda: ..., "what we wait for", timeout_s=30)
        assert nodes[0].log_events("membership.peer_ready")

``LocalTestnet.start(name, bootstrap=[node or multiaddr], network_id=, config={section: {..}},
env={...}, extra_args=[...], wait=True)`` writes ``config`` (merged over the testnet's) as the
node's node.toml; ``NodeProcess`` offers ``status()``, ``ready_peers()``, ``peer_id``,
``addresses``, ``api_url``, ``kill()``, ``terminate() -> exit code``, ``restart()``,
``log_events(event)``, ``log_tail()``. Waits are bounded polls (``wait_until``): another
process's state has no event to wait on.

``run_cli(*args, data_dir=...)``: run ``symphony ...`` in a subprocess, return the
CompletedProcess (text mode).

``GOSSIP_PROBE``: the "module:Class" of tests/node/probe_service.py, for
``config={"extra_services": [GOSSIP_PROBE]}`` when a test needs gossip traffic.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from node.testnet import FAST_MEMBERSHIP, LocalTestnet, NodeProcess
from tests.node.netns import ROOT, Nat, opened

TEST_NETWORK_ID = "itest"
#: test daemons load no model unless a test asks (loading and measuring it costs seconds)
NO_MODEL = {"executor": {"solver": ""}}
#: nor verify (on by default: commit/reveal rounds and the verifier's model hash) unless a
#: test asks, as tests/node/test_verify_integration.py does
NO_VERIFY = {"verify": {"enabled": False}}
#: nor embed agent cards (loading the text embedder costs seconds of CPU per daemon) unless a
#: test asks, as tests/node/test_agents_integration.py does
NO_EMBEDDINGS = {"ledger": {"agent_embeddings": False}}
TESTNET_CONFIG = {**FAST_MEMBERSHIP, **NO_MODEL, **NO_VERIFY, **NO_EMBEDDINGS}
#: the deterministic test solver, as an ``[executor] solver`` value
ARITH_SOLVER = "tests.node.arith_solver:factory"
GOSSIP_PROBE = "tests.node.probe_service:GossipProbe"
STUCK_ON_SHUTDOWN = "tests.node.probe_service:StuckOnShutdown"
FAILS_ON_SHUTDOWN = "tests.node.probe_service:FailsOnShutdown"
CLI_TIMEOUT_S = 60
#: bound on a testnet's convergence waits (daemons connected, a task's rounds done)
CONVERGE_S = 60.0
#: short bid windows and several rounds: a beacon sent before the gossip mesh formed is retried
TASKS = {"bid_window_ms": 1500, "max_rounds": 8, "min_round_ms": 500}


class Testnet(LocalTestnet):
    __test__ = False  # not a test class, whatever its name
    def start_many(self, names: Sequence[str], **kwargs: Any) -> list[NodeProcess]:
        """Start ``names[0]``, then the others at once, all bootstrapping from the first."""
        first = self.start(names[0], **kwargs)
        rest = [self.start(name, bootstrap=[first], wait=False, **kwargs) for name in names[1:]]
        for node in rest:
            node.wait_ready()
        return [first, *rest]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def testnet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Testnet]:
    net = Testnet(tmp_path / "net", network_id=TEST_NETWORK_ID, config=TESTNET_CONFIG)
    try:
        yield net
    finally:
        net.kill_all()
        call = getattr(request.node, "rep_call", None)
        if call is None or call.failed:
            print(net.log_tails(80))


def run_cli(*args: str, data_dir: Path | None = None,
            timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    extra = ["--data-dir", str(data_dir)] if data_dir is not None else []
    return subprocess.run(
        [sys.executable, "-c", "from node.cli.main import main; main()", *args, *extra],
        capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
    )


@pytest.fixture
def nat() -> Iterator[Nat]:
    """The NAT of tests/node/netns.py, or a skip saying why namespaces cannot be made."""
    yield from opened(Nat(), "the NAT")
