"""`symphony model pull` across real daemons (separate processes, loopback, port 0).

Three daemons serve SmolLM2 (their ledger records offer it, ``[relay] seed_models`` offers its
file over the relay); a fourth holds no model file. It pulls the model by name from all three
at once, is killed (-9) mid-transfer, restarts and resumes from the chunks it kept, and ends
with the file whose hash the ledger names. A holder whose stored chunk is damaged sends a bad
chunk: it costs that holder and the chunk comes from another.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.config import DEFAULT_MODEL_NAME
from node.api.token import read_token
from node.testnet import NodeProcess

from .conftest import CONVERGE_S, ROOT, Testnet, run_cli

pytestmark = pytest.mark.integration

#: the holders serve the model and offer its file
HOLDER = {"executor": {"solver": "models", "threads": 1},
          "relay": {"seed_models": [DEFAULT_MODEL_NAME]}}
#: bound on seeding, ledger convergence and a whole pull: generous, so that only a pull that
#: stalls fails the test, not a slow or busy machine
PULL_S = 240.0
#: each holder's upload cap until the kill: three of them send the ~100 MB file at no more than
#: 3 * 4 MiB/s, so the pull takes at least 8 s, a window the chunk-count poll cannot miss
THROTTLE_BPS = 4 << 20
#: the puller is killed once it holds this many chunks (of about a hundred)
KILL_AT_CHUNKS = 12


def relay_status(node: NodeProcess) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(node.api_url + "/relay/status", timeout=10).json()
    return result


def set_upload_limit(node: NodeProcess, bps: int) -> None:
    reply = httpx.post(node.api_url + "/relay/limits", json={"upload_limit_bps": bps},
                       headers={"Authorization": f"Bearer {read_token(node.data_dir)}"},
                       timeout=10)
    assert reply.status_code == 200, reply.text


def seeded(node: NodeProcess) -> dict[str, Any] | None:
    """The node's own complete, verified model version, once it has seeded it."""
    for v in relay_status(node)["versions"]:
        if v["signer"] == node.peer_id and v["format"] == "gguf" and v["verified"]:
            return v
    return None


def offers(node: NodeProcess, weights: str) -> set[str]:
    """Peers whose records in ``node``'s ledger offer the model with weights hash ``weights``."""
    peers = httpx.get(node.api_url + "/ledger/peers", timeout=10).json()["peers"]
    return {p["peer_id"] for p in peers
            if any(m["weights_hash"] == weights for m in p["models"])}


def held_chunks(node: NodeProcess, name: str) -> int:
    return max((v["held"] for v in relay_status(node)["versions"] if v["name"] == name),
               default=0)


def start_holders(testnet: Testnet, count: int = 3,
                  puller: bool = True) -> tuple[list[NodeProcess], NodeProcess | None, str]:
    """``count`` holders, each seeded, and (with ``puller``) a node without the model whose
    ledger offers the model of every holder; returns them and the weights hash."""
    first = testnet.start("h1", config=HOLDER)
    others = [testnet.start(f"h{i}", bootstrap=[first], wait=False, config=HOLDER)
              for i in range(2, count + 1)]
    plain = testnet.start("puller", bootstrap=[first], wait=False) if puller else None
    holders = [first, *others]
    for node in (*others, *([plain] if plain else [])):
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: all(seeded(h) for h in holders),
                       "every holder to seed the model", PULL_S)
    weights = seeded(first)["name"]  # type: ignore[index]
    assert {seeded(h)["name"] for h in holders} == {weights}  # type: ignore[index]
    if plain is not None:
        testnet.wait_until(lambda: offers(plain, weights) >= {h.peer_id for h in holders},
                           "the puller's ledger to offer the model of every holder", PULL_S)
    return holders, plain, weights


def file_hash(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=32).hexdigest()


def test_model_pull_from_three_peers_survives_a_kill_and_resumes(
    testnet: Testnet, tmp_path: Path
) -> None:
    holders, puller, weights = start_holders(testnet)
    assert puller is not None
    total_chunks = seeded(holders[0])["chunks"]  # type: ignore[index]
    for h in holders:
        set_upload_limit(h, THROTTLE_BPS)
    out = tmp_path / "smollm2.gguf"
    cli = subprocess.Popen(
        [sys.executable, "-c", "from node.cli.main import main; main()", "model", "pull",
         DEFAULT_MODEL_NAME, "--out", str(out), "--data-dir", str(puller.data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        testnet.wait_until(lambda: held_chunks(puller, weights) >= KILL_AT_CHUNKS,
                           f"the puller to hold {KILL_AT_CHUNKS} chunks", PULL_S)
        before = relay_status(puller)
        (v,) = [v for v in before["versions"] if v["name"] == weights]
        assert v["state"] == "fetching" and v["held"] < total_chunks
        # every holder is a source: the transfer's own signer and the twins' signers
        assert {v["signer"], *v["holders"]} == {h.peer_id for h in holders}
        puller.kill()
    finally:
        cli.wait(timeout=60)
    assert cli.returncode != 0  # its daemon died under it
    for h in holders:
        set_upload_limit(h, 0)
    puller.restart()
    pulled = run_cli("model", "pull", DEFAULT_MODEL_NAME, "--out", str(out),
                     data_dir=puller.data_dir, timeout_s=PULL_S)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "from 3 peers" in pulled.stdout, pulled.stdout
    assert file_hash(out) == weights  # the weights hash the ledger names
    after = relay_status(puller)
    size = out.stat().st_size
    # resumed: the chunks held before the kill were kept, not fetched again
    assert 0 < after["bytes_in"] <= size - KILL_AT_CHUNKS * (1 << 20) + (1 << 20)
    (v,) = [v for v in after["versions"] if v["name"] == weights]
    assert v["verified"] is True and v["held"] == total_chunks
    senders = {p for p in (v["signer"], *v["holders"])}
    assert senders == {h.peer_id for h in holders}


def test_model_pull_refetches_a_bad_chunk_from_another_peer_and_penalizes_the_liar(
    testnet: Testnet, tmp_path: Path
) -> None:
    holders, puller, weights = start_holders(testnet)
    assert puller is not None
    liar = holders[1]
    # damage every chunk the liar stores: whatever it is asked for, it sends wrong bytes
    objects = [p for p in (liar.data_dir / "chunks" / "objects").rglob("*") if p.is_file()]
    assert len(objects) >= 90
    for obj in objects:
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 0xFF
        obj.write_bytes(bytes(data))
    out = tmp_path / "smollm2.gguf"
    pulled = run_cli("model", "pull", weights, "--out", str(out), data_dir=puller.data_dir,
                     timeout_s=PULL_S)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert file_hash(out) == weights
    status = relay_status(puller)
    assert status["bad_chunks"] >= 1
    (v,) = [v for v in status["versions"] if v["name"] == weights]
    assert liar.peer_id in v["failed_sources"]
    penalties = puller.status()["penalties"]
    assert penalties[liar.peer_id]["total"] > 0
    assert any("bad relay chunk" in r for r in penalties[liar.peer_id]["reasons"])
    assert all(h.peer_id not in penalties for h in holders if h is not liar)


def test_model_pull_serve_blocks_10_20_fetches_only_that_range(
    testnet: Testnet, tmp_path: Path
) -> None:
    holders, _, weights = start_holders(testnet, count=2, puller=False)
    size = seeded(holders[0])["total_size"]  # type: ignore[index]
    server = testnet.start("stage", bootstrap=[holders[0]], config={"inference": {
        "model": weights, "threads": 1}}, extra_args=["--serve-blocks", "10:20"])

    def serving() -> dict[str, Any] | None:
        shown: dict[str, Any] = httpx.get(server.api_url + "/inference/", timeout=10).json()
        assert not shown["problem"], shown["problem"]
        return shown if shown["serving"] else None

    shown = testnet.wait_until(serving, "the stage server to fetch and load blocks 10:20",
                               PULL_S)
    assert shown["blocks"] == [10, 20] and shown["model"] == DEFAULT_MODEL_NAME
    assert shown["model_bytes"] == size
    # the header and ten of thirty blocks: no embedding, no other block (a third of the
    # blocks' bytes, well under half the file)
    assert 0 < shown["bytes_fetched"] < size // 2, shown
    held = [v for v in relay_status(server)["versions"] if v["name"] == weights]
    assert held and all(v["state"] == "fetching" and v["held"] < v["chunks"] for v in held)
    # the sparse copy computes blocks 10:20 exactly as the whole file does
    import numpy as np

    from models.blocks import StageCache, load_stage
    from models.registry import resolve

    partial = server.data_dir / "models" / f"{weights}.partial.gguf"
    mine, whole = load_stage(partial, 10, 20), load_stage(resolve(DEFAULT_MODEL_NAME).path, 10, 20)
    hidden = np.random.default_rng(7).standard_normal((3, mine.hidden_size)).astype(np.float32)
    np.testing.assert_array_equal(mine.forward(hidden, 0, StageCache()),
                                  whole.forward(hidden, 0, StageCache()))
