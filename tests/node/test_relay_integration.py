"""The weight relay across real daemons (separate processes, loopback, port 0).

One publisher and five daemons: a 64 MiB artifact published with the CLI reaches all five with
identical bytes; then a second version is published and a relay in the middle of the plan is
killed (-9) while it is forwarding: every survivor still completes, by re-attaching.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.api.token import read_token
from node.testnet import NodeProcess

from .conftest import Testnet, run_cli

pytestmark = pytest.mark.integration

SIZE = 64 * 1024 * 1024
#: bound on a whole 64 MiB relay: generous, so that only a relay that stalls fails the test, not
#: a slow or busy machine
RELAY_S = 240.0
#: every node's upload cap while v2 spreads, until the kill: a relay's first half then takes
#: at least SIZE / 2 / THROTTLE_BPS = 8 s to arrive, a window the 0.1 s poll cannot miss
THROTTLE_BPS = 4 << 20


def set_upload_limit(node: NodeProcess, bps: int) -> None:
    """Cap ``node``'s total chunk upload at ``bps`` bytes/s (0: no cap)."""
    reply = httpx.post(node.api_url + "/relay/limits", json={"upload_limit_bps": bps},
                       headers={"Authorization": f"Bearer {read_token(node.data_dir)}"},
                       timeout=10)
    assert reply.status_code == 200 and reply.json()["upload_limit_bps"] == bps, reply.text


def relay_status(node: NodeProcess) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(node.api_url + "/relay/status", timeout=10).json()
    return result


def version_of(node: NodeProcess, name: str, version: int) -> dict[str, Any] | None:
    for v in relay_status(node)["versions"]:
        if v["name"] == name and v["version"] == version:
            return v
    return None


def complete(node: NodeProcess, name: str, version: int) -> bool:
    v = version_of(node, name, version)
    return v is not None and v["state"] == "complete"


def write_artifact(path: Path, seed: int) -> str:
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(SIZE // (1 << 20)):
            f.write(rng.randbytes(1 << 20))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_hash(node: NodeProcess, name: str, version: int, out: Path) -> str:
    got = run_cli("relay", "get", name, "--version", str(version), "--out", str(out),
                  data_dir=node.data_dir)
    assert got.returncode == 0, got.stderr
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_64mib_reaches_five_daemons_and_survives_a_killed_middle_relay(
    testnet: Testnet, tmp_path: Path
) -> None:
    nodes = testnet.start_many(["pub", "a", "b", "c", "d", "e"])
    pub, peers = nodes[0], nodes[1:]
    testnet.wait_all_connected(60)

    # v1: everyone gets identical bytes
    art = tmp_path / "weights-v1.bin"
    digest = write_artifact(art, 1)
    published = run_cli("relay", "publish", str(art), "--name", "model", "--format", "gguf",
                        "--no-wait", data_dir=pub.data_dir)
    assert published.returncode == 0, published.stderr
    assert "model v1" in published.stdout and "5 recipients" in published.stdout
    testnet.wait_until(lambda: all(complete(p, "model", 1) for p in peers),
                       "every peer to complete v1", RELAY_S)
    for p in peers:
        assert export_hash(p, "model", 1, tmp_path / f"{p.name}-v1.bin") == digest
    v1 = version_of(pub, "model", 1)
    assert v1 is not None
    assert all(v1["peers"].get(p.peer_id) == v1["chunks"] for p in peers)  # progress gossip
    assert sum(relay_status(p)["bytes_in"] for p in peers) == 5 * SIZE  # each chunk once

    # v2: kill a relay that has children while it is forwarding. Every node's upload is
    # capped until the kill, so a middle relay is part-way through for seconds, not for a
    # moment the poll below could miss on a fast machine or a slow one
    art2 = tmp_path / "weights-v2.bin"
    digest2 = write_artifact(art2, 2)
    for node in nodes:
        set_upload_limit(node, THROTTLE_BPS)
    published = run_cli("relay", "publish", str(art2), "--name", "model", "--no-wait",
                        data_dir=pub.data_dir)
    assert published.returncode == 0, published.stderr
    by_id = {p.peer_id: p for p in peers}

    # Any relay with children will do, whoever its parent: which peers forward depends on the
    # uploads the publisher's ledger holds when it plans v2 (each peer's capability record
    # may still carry what it measured uncapped during v1), so the plan may be a chain, a
    # star under one peer, or stripes; each of them has a peer with children
    def forwarding_middle() -> NodeProcess | None:
        for p in peers:
            v = version_of(p, "model", 2)
            if v and v["children"] and 0 < v["held"] < v["chunks"] // 2:
                return p
        return None

    victim = testnet.wait_until(forwarding_middle, "a middle relay to be forwarding v2",
                                RELAY_S)
    orphans = [by_id[c] for c in version_of(victim, "model", 2)["children"]]  # type: ignore[index]
    victim.kill()
    survivors = [p for p in peers if p is not victim]
    for node in (pub, *survivors):
        set_upload_limit(node, 0)
    testnet.wait_until(lambda: all(complete(p, "model", 2) for p in survivors),
                       "every survivor to complete v2", RELAY_S)
    for orphan in orphans:
        v = version_of(orphan, "model", 2)
        assert v is not None and victim.peer_id in v["failed_sources"]
    for p in survivors:
        assert export_hash(p, "model", 2, tmp_path / f"{p.name}-v2.bin") == digest2
    # keep_versions=2: both versions are still held; status lists them
    shown = run_cli("relay", "status", data_dir=survivors[0].data_dir)
    assert shown.returncode == 0 and "model" in shown.stdout, shown.stderr
