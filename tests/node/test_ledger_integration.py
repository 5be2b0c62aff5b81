"""The gossip ledger across real daemons (separate processes, loopback, port 0).

Four daemons meet; a test peer hands one of them a record and 20 attestations (which spread by
anti-entropy only) and offers every daemon two forged records; a fifth daemon joins late and
must converge to the same digest; a daemon killed with -9 restarts with its ledger intact.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import trio

from crypto.envelope import Envelope
from crypto.keys import Identity
from node.api.token import read_token
from node.p2p.host import open_p2p
from node.testnet import NodeProcess
from protocol.codec import encode
from protocol.ledger.messages import LedgerPush
from protocol.ledger.records import (
    ATTESTATION_DOMAIN,
    CAPABILITY_DOMAIN,
    Attestation,
    AttestationKind,
    CapabilityRecord,
    HardwareSummary,
    Role,
)
from protocol.names import protocol_id

from .conftest import TEST_NETWORK_ID, Testnet, run_cli

pytestmark = pytest.mark.integration

#: bound on every convergence wait below
CONVERGE_S = 45.0
#: bound on a late joiner's convergence, from the moment it is up: its sync with the peer it
#: connects to and a few anti-entropy rounds (1 s each, LEDGER_FAST), with room for a loaded
#: machine; a joiner that only caught up by slower paths (record republishing, retries after
#: failed syncs) would miss it
JOIN_S = 20.0
LEDGER_FAST = {
    "ledger": {"anti_entropy_ms": 1000, "capability_poll_ms": 200, "min_republish_ms": 200}
}
N_ATTESTATIONS = 20


def _ledger(node: NodeProcess) -> dict[str, Any]:
    result: dict[str, Any] = node.status()["services"]["ledger"]
    return result


def _get(node: NodeProcess, path: str) -> Any:
    response = httpx.get(node.api_url + path, timeout=5.0)
    response.raise_for_status()
    return response.json()


def _record(signer: Identity, peer_id: str, now_ms: int, price: float) -> bytes:
    rec = CapabilityRecord(
        network_id=TEST_NETWORK_ID,
        peer_id=peer_id,
        seq=now_ms,
        issued_at_ms=now_ms,
        expires_at_ms=now_ms + 10 * 60_000,
        listen_addrs=(),
        models=(),
        hardware=HardwareSummary(
            device_kind="cpu", device_name="test", memory_bytes=0, cpu_cores=1
        ),
        price_per_1k_tokens=price,
        free_slots=0,
        max_slots=0,
        load=0.0,
        roles=(Role.RELAY,),
        tags=("test-peer",),
        software_version="test",
    )
    return encode(rec)


def _attestation(observer: Identity, subject: str, i: int, now_ms: int) -> Envelope:
    att = Attestation(
        network_id=TEST_NETWORK_ID,
        subject=subject,
        object_id=i.to_bytes(4, "big"),
        kind=AttestationKind.TASK_COMPLETED if i % 4 else AttestationKind.TASK_FAILED,
        outcome="integration",
        evidence_hash=b"",
        amount=0,
        observed_at_ms=now_ms,
        expires_at_ms=now_ms + 3_600_000,
    )
    return Envelope.sign(observer, ATTESTATION_DOMAIN, encode(att))


def _inject(tester: Identity, targets: list[NodeProcess], victim: str) -> None:
    """Hand targets[0] a valid record and attestations; offer every target two forgeries."""
    now = int(time.time() * 1000)
    own = Envelope.sign(tester, CAPABILITY_DOMAIN, _record(tester, tester.peer_id, now, 1.0))
    subjects = [t.peer_id for t in targets]
    atts = tuple(
        _attestation(tester, subjects[i % len(subjects)], i, now) for i in range(N_ATTESTATIONS)
    )
    # 1. signed by the tester but claiming to be the victim; 2. the victim's key, not its signature
    claim = Envelope.sign(tester, CAPABILITY_DOMAIN, _record(tester, victim, now, 999.0))
    victim_key = next(t for t in targets if t.peer_id == victim)
    stolen = Envelope(
        public_key=_public_key(victim_key),
        domain=CAPABILITY_DOMAIN,
        payload=_record(tester, victim, now, 999.0),
        signature=claim.signature,
    )
    valid = LedgerPush(records=(own,), attestations=atts, reply=False, more=False)
    forged = LedgerPush(records=(claim, stolen), attestations=(), reply=False, more=False)

    async def main() -> None:
        async with open_p2p(tester.seed, listen=["/ip4/127.0.0.1/tcp/0"]) as transport:
            msg = protocol_id(TEST_NETWORK_ID, "msg")
            for i, target in enumerate(targets):
                peer = await transport.connect(target.addresses[0])
                frames = [encode(valid), encode(forged)] if i == 0 else [encode(forged)]
                for frame in frames:
                    ack = await transport.request(peer, msg, frame, max_response_bytes=256)
                    assert ack == b"", ack

    trio.run(main)


def _public_key(node: NodeProcess) -> bytes:
    from crypto.peer_id import public_key_from_peer_id

    return public_key_from_peer_id(node.peer_id)


def _converged(nodes: list[NodeProcess], live: int, atts: int) -> bool:
    views = [_ledger(n) for n in nodes]
    return len({v["digest"] for v in views}) == 1 and all(
        v["live_peers"] == live and v["attestations"] == atts for v in views
    )


def test_five_daemons_converge_reject_forgeries_and_keep_their_ledger(testnet: Testnet) -> None:
    nodes = testnet.start_many(["a", "b", "c", "d"], config=LEDGER_FAST)
    a, b, c, d = nodes
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(
        lambda: _converged(nodes, 4, 0), "4 daemons to hold each other's records", CONVERGE_S
    )
    genuine_b = _get(a, f"/ledger/peers/{b.peer_id}")["record"]

    tester = Identity.from_seed(b"\x42" * 32)
    _inject(tester, nodes, victim=b.peer_id)
    testnet.wait_until(
        lambda: _converged(nodes, 5, N_ATTESTATIONS),
        "the tester's record and attestations to reach every daemon by anti-entropy",
        CONVERGE_S,
    )
    for node in nodes:  # the forgeries were refused and counted everywhere, b is still b
        counts = _ledger(node)["rejections"][tester.peer_id]
        assert counts == {"bad_signature": 1, "signer_not_subject": 1}, (node.name, counts)
        shown = _get(node, f"/ledger/peers/{b.peer_id}")["record"]
        assert shown["seq"] >= genuine_b["seq"] and shown["price_per_1k_tokens"] != 999.0
        assert node.running

    # a late joiner converges to the same digest within JOIN_S of being up
    e = testnet.start("e", bootstrap=[a], config=LEDGER_FAST)
    everyone = [*nodes, e]
    testnet.wait_until(lambda: _converged(everyone, 6, N_ATTESTATIONS), "e to converge", JOIN_S)
    # nobody passed the forgeries on: a daemon that had would be refused by its peers (counted
    # under its own peer id, not the tester's), so the only refusals anywhere are of the
    # tester's own pushes, and e, which the tester never met, refused nothing
    assert _ledger(e)["rejections"] == {}, _ledger(e)["rejections"]
    for node in nodes:
        assert set(_ledger(node)["rejections"]) == {tester.peer_id}, (node.name, _ledger(node))

    # a daemon killed at any instant restarts with its ledger
    c.kill()
    c.restart()
    (restored,) = [ev for ev in c.log_events("ledger.restored")][-1:]
    assert restored["attestations"] == N_ATTESTATIONS and restored["records"] >= 6
    testnet.wait_until(lambda: _converged(everyone, 6, N_ATTESTATIONS), "c to rejoin", CONVERGE_S)

    # the CLI shows the same ledger
    shown = run_cli("ledger", "peers", "--json", data_dir=d.data_dir)
    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)["peers"]
    assert {p["peer_id"] for p in listed} == {n.peer_id for n in everyone} | {tester.peer_id}
    assert sum(p["self"] for p in listed) == 1
    atts = run_cli("ledger", "attestations", "--peer", b.peer_id, "--json", data_dir=d.data_dir)
    assert json.loads(atts.stdout)["count"] == len(range(1, N_ATTESTATIONS, 4))
    show = run_cli("ledger", "show", tester.peer_id, data_dir=d.data_dir)
    assert show.returncode == 0 and "test-peer" in show.stdout, show.stderr
    table = run_cli("ledger", "peers", data_dir=d.data_dir)
    assert table.returncode == 0 and "(self)" in table.stdout
    for node in everyone:  # and no machine or store ever raised
        assert not node.log_events("driver.machine_error"), node.log_tail()
        assert not node.log_events("driver.perform_error"), node.log_tail()

    # a changed offer is re-signed and reaches every node (the API needs the token)
    token = read_token(a.data_dir)
    denied = httpx.post(a.api_url + "/ledger/capability", json={"tags": ["x"]}, timeout=5.0)
    assert denied.status_code == 401
    changed = httpx.post(
        a.api_url + "/ledger/capability",
        json={"tags": ["bench", "changed"], "price_per_1k_tokens": 2.5},
        headers={"Authorization": f"Bearer {token}"},
        timeout=5.0,
    )
    assert changed.status_code == 200, changed.text
    testnet.wait_until(
        lambda: all(
            _get(n, f"/ledger/peers/{a.peer_id}")["record"]["tags"] == ["bench", "changed"]
            for n in everyone
        ),
        "a's new record to reach every node",
        CONVERGE_S,
    )
