"""A trained adapter becomes an agent, across three real daemons (loopback, port 0), on the
tiny model: the learner node L publishes an exported LoRA adapter with ``symphony rl
publish``; the server S, whose node.toml names the adapter's content hash in an
``[[agents]]`` table, fetches it through the relay, checks it against the hash, loads it beside
its model and bids; the asker A's ``ask --agent arith`` is answered by S's agent, with
verification on and every result checked: L, which serves the same model and verifies,
takes the adapter the result names from its relay and re-runs S's layer states with it
merged into its check model, and the result passes. Beside it, S
names two adapters that must never run: one whose artifact a hostile publisher filled with
other bytes, and one llama.cpp refuses (junk under its right hash). Each is a clear state in
S's executor status, and S keeps serving. ``rl publish`` itself refuses a file that is not a
LoRA GGUF.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node.testnet import NodeProcess

from .conftest import CONVERGE_S, TASKS, Testnet, run_cli

pytestmark = pytest.mark.integration

ENV = {"OMP_NUM_THREADS": "1"}
#: every result checked by one verifier (a candidate serves the result's model: L)
VERIFY = {"enabled": True, "sample_rate": 1.0, "verifiers": 1, "commit_window_ms": 20000}


def _adapters(node: NodeProcess) -> dict[str, str]:
    return node.status()["services"]["executor"]["adapters"]  # type: ignore[no-any-return]


def _agent(name: str, adapter: str) -> dict[str, Any]:
    return {"name": name, "description": f"The {name} agent.", "skills": ["arithmetic"],
            "adapter": adapter}


def test_a_published_adapter_is_served_as_an_agent_and_answers_through_the_market(
        testnet: Testnet, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("llama_cpp")
    from node.agents.adapters import adapter_hash, file_adapter_hash
    from tests.models import rl_tiny, tiny

    model = tiny.write_gguf(tiny.tiny_model(seed=0), tmp_path / "tiny.gguf")
    policy = rl_tiny.make_policy(model)
    rl_tiny.perturb(policy, scale=0.5)
    adapter = rl_tiny.export_adapter(policy, tmp_path / "adapters", version=1).path
    good = file_adapter_hash(adapter)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    forged = tmp_path / "forged.bin"
    forged.write_bytes(b"not the adapter its name says")
    wanted = adapter_hash(b"an adapter nobody has")  # the name the hostile publisher fills

    served = {"solver": "models", "model": str(model), "threads": 1}
    learner = testnet.start("learner", env=ENV, config={
        "executor": served, "verify": {**VERIFY, "model": str(model)}})
    server = testnet.start("server", bootstrap=[learner], wait=False, env=ENV, config={
        "executor": served, "verify": {**VERIFY, "verifier": False},
        "agents": [_agent("arith", good), _agent("junk", file_adapter_hash(junk)),
                   _agent("forged", wanted)]})
    asker = testnet.start("asker", bootstrap=[learner], wait=False, env=ENV,
                          config={"tasks": TASKS, "verify": {**VERIFY, "verifier": False}})
    for node in (server, asker):
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: learner.status()["services"]["verify"]["verifier"],
                       "the learner's verifier loaded", CONVERGE_S)
    testnet.wait_until(lambda: len(_adapters(server)) == 3, "the server's agents started",
                       CONVERGE_S)
    assert _adapters(server)["arith"].startswith("waiting for adapter")

    refused = run_cli("rl", "publish", str(junk), data_dir=learner.data_dir)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "not a LoRA adapter" in refused.stderr or "not a GGUF" in refused.stderr, refused
    shown = run_cli("rl", "publish", str(adapter), "--json", data_dir=learner.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    published = json.loads(shown.stdout)
    assert published["adapter"] == good == published["artifact"]
    for path, name in ((junk, file_adapter_hash(junk)), (forged, wanted)):
        sent = run_cli("relay", "publish", str(path), "--name", name, "--no-wait",
                       data_dir=learner.data_dir)
        assert sent.returncode == 0, sent.stdout + sent.stderr

    def settled() -> bool:
        states = _adapters(server)
        return states["arith"] == "ready" and states["junk"].startswith("failed") \
            and "refused" in states["forged"]

    testnet.wait_until(settled, "the server's adapters taken or refused", CONVERGE_S)
    states = _adapters(server)
    assert "llama.cpp refused the LoRA adapter" in states["junk"], states
    assert "its bytes hash to" in states["forged"] and "waiting" in states["forged"], states
    bidding = server.status()["services"]["executor"]["agents"]
    assert [(a["name"], a["adapter"]) for a in bidding] == [("arith", good)]

    asked = run_cli("ask", "Add 3 and 2.", "--agent", "arith", "--k", "1", "--max-tokens", "6",
                    "--json", "--deadline-ms", "60000", data_dir=asker.data_dir)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    snap = json.loads(asked.stdout)
    assert snap["phase"] == "done", snap
    assert (snap["agent"], snap["executor"]) == ("arith", server.peer_id), snap
    # checked on the adapter: the learner re-ran the server's layers with it merged
    assert [r["verification"] for r in snap["results"]] == ["passed"], snap
    assert learner.log_events("verify.attest"), learner.log_tail()
    for node in (learner, server, asker):
        assert not node.log_events("driver.machine_error"), node.log_tail()
        assert not node.log_events("driver.perform_error"), node.log_tail()
    assert server.log_events("adapter.refused") and server.log_events("adapter.failed")
