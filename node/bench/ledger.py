"""`symphony bench ledger`: the gossip ledger on a local network of real daemons (processes).

Measured in one run:

* **late joiner**: ``founders`` daemons hold the same ``attestations`` (written to their
  SQLite before start, re-verified when they load it); one more daemon joins and pulls them by
  anti-entropy. ``join_sync_s`` runs from its transport starting (the first moment it can
  dial) to its last pull ending (log timestamps: connect, digests, every batch verified and
  stored). It does not start at the ledger service's start: the daemon starts every service
  (the executor's model load and self-benchmark included, which take seconds) before its
  transport, and that is start-up, not sync;
  ``join_ready_to_converged_s`` from the daemon being ready to its digest equalling a
  founder's (polled over HTTP); ``join_total_s`` adds its process start (start-up included).
  Bytes are the ledger messages the machines sent (``bytes_sent``: digests, requests, pushes;
  transport framing and gossipsub relaying not included). Baseline in the same run:
  verifying and merging the same attestations in this process (``local_merge_s``), and their
  ratio (``join_vs_local_merge``).
* **record update** on the resulting network (5 daemons; quick: 3): one node changes its
  offer (``POST /ledger/capability``). ``update_propagation_ms``: the latest arrival of the new
  record (each node's arrival time minus the signing time, one machine's clock);
  ``update_converge_ms``: polled over HTTP until every node shows it (includes polling);
  ``update_bytes_per_node``: mean ledger bytes sent per node meanwhile.

``--link SPEC`` runs every daemon behind that link (node/p2p/link.py; ``link`` echoes it); the
in-process merge, the baseline, crosses none.

``--quick`` (under a minute): 2 founders + 1 joiner, 1,000 attestations. Full: 4 + 1, 10,000.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from crypto.envelope import Envelope
from crypto.keys import Identity
from node.api.token import read_token
from node.db import Database
from node.ledger.store import SCHEMA, LedgerStore
from node.testnet import FAST_MEMBERSHIP, LocalTestnet, NodeProcess, TestnetError
from protocol.codec import decode, encode
from protocol.ledger.machine import LedgerMachine
from protocol.ledger.records import ATTESTATION_DOMAIN, Attestation, AttestationKind

NETWORK_ID = "bench-ledger"
#: (founders, attestations)
FULL = (4, 10_000)
QUICK = (2, 1_000)
OBSERVERS = 50
SUBJECTS = 20
#: bound on every wait (a daemon's start, model load included, on shared cores)
WAIT_S = 120.0
#: polling the record update (cheap GETs); a join is timed from log timestamps and polled
#: slowly, so that status requests do not steal the joiner's CPU
POLL_S = 0.02
JOIN_POLL_S = 0.5
CONFIG = {
    **FAST_MEMBERSHIP,
    "ledger": {"capability_poll_ms": 200, "min_republish_ms": 200},
}


def run(quick: bool, link: str = "") -> dict[str, Any]:
    founders, n = QUICK if quick else FULL
    envelopes = _attestations(n, int(time.time() * 1000))
    figures: dict[str, Any] = {"link": link, "daemons": founders + 1, "attestations": n}
    figures["local_merge_s"] = _local_merge_s(envelopes)
    with tempfile.TemporaryDirectory(prefix="symphony-bench-ledger-") as tmp:
        net = LocalTestnet(Path(tmp), network_id=NETWORK_ID, config=CONFIG, link=link)
        try:
            figures.update(_join(net, founders, envelopes))
            figures.update(_update(net))
        finally:
            net.kill_all()
    figures["join_vs_local_merge"] = figures["join_sync_s"] / figures["local_merge_s"]
    return figures


def _attestations(n: int, now_ms: int) -> list[Envelope]:
    observers = [Identity.from_seed(i.to_bytes(32, "big")) for i in range(1, OBSERVERS + 1)]
    subjects = [
        Identity.from_seed((10_000 + i).to_bytes(32, "big")).peer_id for i in range(SUBJECTS)
    ]
    kinds = (
        AttestationKind.TASK_COMPLETED,
        AttestationKind.TASK_FAILED,
        AttestationKind.RELAY_SERVED,
    )
    out = []
    for i in range(n):
        observed = now_ms - (i // OBSERVERS) * 1000  # <= 60 per observer-minute (quota 240)
        att = Attestation(
            network_id=NETWORK_ID,
            subject=subjects[i % SUBJECTS],
            object_id=i.to_bytes(8, "big"),
            kind=kinds[i % len(kinds)],
            outcome="bench",
            evidence_hash=b"",
            amount=i % 7,
            observed_at_ms=observed,
            expires_at_ms=observed + 24 * 3600 * 1000,
        )
        out.append(Envelope.sign(observers[i % OBSERVERS], ATTESTATION_DOMAIN, encode(att)))
    return out


def _local_merge_s(envelopes: list[Envelope]) -> float:
    import random

    machine = LedgerMachine(Identity.from_seed(b"\x01" * 32), NETWORK_ID, random.Random(0))
    data = [e.encode() for e in envelopes]
    started = time.perf_counter()
    report = machine.restore([], data, int(time.time() * 1000))
    elapsed = time.perf_counter() - started
    if report.attestations != len(envelopes):
        raise RuntimeError(f"baseline merged {report.attestations} of {len(envelopes)}")
    return elapsed


def _seed(data_dir: Path, envelopes: list[Envelope]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(data_dir / "node.db")
    db.apply_schema(SCHEMA)
    store = LedgerStore(db)
    with db.transaction():
        for env in envelopes:
            store.save_attestation(env, decode(env.payload, Attestation), env.content_hash)
    db.close()


def _poll(predicate: Callable[[], bool], what: str, interval_s: float = POLL_S) -> None:
    """Poll another process's state every ``interval_s`` (testnet's polls are 0.1 s)."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() >= deadline:
            raise TestnetError(f"timed out after {WAIT_S} s waiting for {what}")
        time.sleep(interval_s)


def _log_time(node: NodeProcess, event: str) -> float:
    """Epoch seconds of the last ``event`` in the node's JSON log."""
    stamp = node.log_events(event)[-1]["timestamp"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _ledger(node: NodeProcess) -> dict[str, Any]:
    result: dict[str, Any] = node.status()["services"]["ledger"]
    return result


def _bytes(nodes: list[NodeProcess]) -> list[int]:
    return [int(_ledger(n)["stats"].get("bytes_sent", 0)) for n in nodes]


def _join(net: LocalTestnet, founders: int, envelopes: list[Envelope]) -> dict[str, Any]:
    names = [chr(ord("a") + i) for i in range(founders)]
    for name in names:
        _seed(net.base_dir / name, envelopes)
    first = net.start(names[0], timeout_s=WAIT_S)
    rest = [net.start(name, bootstrap=[first], wait=False) for name in names[1:]]
    for node in rest:
        node.wait_ready(WAIT_S)
    nodes = [first, *rest]
    net.wait_all_connected(WAIT_S)
    net.wait_until(
        lambda: (
            len({_ledger(x)["digest"] for x in nodes}) == 1
            and all(_ledger(x)["attestations"] == len(envelopes) for x in nodes)
        ),
        "the founders to agree",
        WAIT_S,
    )
    before = _bytes(nodes)
    spawned = time.monotonic()
    joiner = net.start("joiner", bootstrap=[first], timeout_s=WAIT_S)
    ready = time.monotonic()
    _poll(
        lambda: _ledger(joiner)["digest"] == _ledger(first)["digest"],
        "the joiner to converge",
        JOIN_POLL_S,
    )
    done = time.monotonic()
    started_at = _log_time(joiner, "transport.started")
    synced_at = _log_time(joiner, "ledger.sync_end")
    after = _bytes(nodes)
    joiner_bytes = _bytes([joiner])[0]
    rounds = sum(int(e.get("rounds", 0)) for e in joiner.log_events("ledger.sync_end"))
    served = sum(a - b for a, b in zip(after, before, strict=True))
    return {
        "join_sync_s": synced_at - started_at,
        "join_ready_to_converged_s": done - ready,
        "join_total_s": done - spawned,
        "join_pull_rounds": rounds,
        "join_bytes_served": served,
        "join_bytes_joiner": joiner_bytes,
        "join_bytes_per_attestation": (served + joiner_bytes) / max(1, len(envelopes)),
    }


def _update(net: LocalTestnet) -> dict[str, Any]:
    nodes = [n for n in net.nodes.values() if n.running]
    net.wait_until(lambda: len({_ledger(x)["digest"] for x in nodes}) == 1, "all to agree", WAIT_S)
    updater = nodes[0]
    token = read_token(updater.data_dir)
    before = _bytes(nodes)
    started = time.monotonic()
    response = httpx.post(
        updater.api_url + "/ledger/capability",
        json={"tags": ["bench", f"update-{time.time_ns()}"]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10.0,
    )
    response.raise_for_status()
    seq = int(response.json()["record"]["seq"])

    def everyone_has_it() -> bool:
        for node in nodes:
            got = httpx.get(f"{node.api_url}/ledger/peers/{updater.peer_id}", timeout=5.0)
            if got.json()["record"]["seq"] < seq:
                return False
        return True

    _poll(everyone_has_it, "the new record to reach every node")
    elapsed_ms = (time.monotonic() - started) * 1000
    after = _bytes(nodes)
    arrivals = []  # each node's clock when the record arrived, minus when it was signed
    for node in nodes[1:]:
        shown = httpx.get(f"{node.api_url}/ledger/peers/{updater.peer_id}", timeout=5.0).json()
        arrivals.append(shown["last_seen_ms"] - shown["record"]["issued_at_ms"])
    return {
        "update_propagation_ms": max(arrivals),
        "update_converge_ms": elapsed_ms,
        "update_bytes_per_node": statistics.fmean(
            a - b for a, b in zip(after, before, strict=True)
        ),
    }
