"""A hostile libp2p peer against a real daemon: raw streams on every protocol py-libp2p serves
(gossipsub, identify, identify push, ping) carrying bytes that are no valid message. The
daemon must stay up, penalize the peer for each, answer /status, and say who it is."""

from __future__ import annotations

import hashlib

import pytest
import trio
from libp2p.identity.identify.pb.identify_pb2 import Identify

from node.p2p.host import open_p2p
from node.transport import TransportError

from .conftest import Testnet

pytestmark = pytest.mark.integration

#: a length prefix of 3, then three bytes no protobuf decoder accepts (wire type 7)
NOT_PROTOBUF = b"\x03\x0f\x0f\x0f"
ATTACKS = {
    "/meshsub/1.2.0": NOT_PROTOBUF,
    "/meshsub/1.1.0": NOT_PROTOBUF,
    "/meshsub/1.0.0": NOT_PROTOBUF,
    "/ipfs/id/push/1.0.0": NOT_PROTOBUF,
    "/ipfs/id/1.0.0": b"not a protobuf",  # the asking side must send nothing at all
    "/ipfs/ping/1.0.0": b"short",  # a ping is 32 bytes: cut short, then the stream ends
}
#: bound on each attack's stream being ended by the daemon
STREAM_END_S = 30.0


async def _attack(address: str) -> tuple[str, bytes]:
    seed = hashlib.sha256(b"hostile-peer").digest()
    async with open_p2p(seed) as attacker:
        peer = await attacker.connect(address)
        for protocol, junk in ATTACKS.items():
            stream = await attacker.open_stream(peer, protocol)
            await stream.write(junk)
            await stream.close()
            with trio.fail_after(STREAM_END_S):
                try:
                    while await stream.read(1 << 16):
                        pass
                except TransportError:
                    pass  # the daemon reset the stream
        # identify, asked properly, names the daemon's software
        stream = await attacker.open_stream(peer, "/ipfs/id/1.0.0")
        answer = b""
        with trio.fail_after(STREAM_END_S):
            while chunk := await stream.read(1 << 16):
                answer += chunk
        await stream.close()
        return attacker.peer_id, answer


def test_garbage_on_every_libp2p_protocol_is_penalized_and_the_daemon_stays_up(
        testnet: Testnet) -> None:
    a = testnet.start("a")
    attacker, answer = trio.run(_attack, a.addresses[0])

    assert a.running
    status = a.status()  # still answering
    reasons = " ".join(status["penalties"][attacker]["reasons"])
    for protocol in ATTACKS:
        assert f"on {protocol}" in reasons, (protocol, reasons)
    assert status["penalties"][attacker]["total"] >= 10 * len(ATTACKS)
    assert status["faults"]["undecodable"] >= 5 and status["faults"]["bad_framing"] >= 1
    # one log line per peer and kind, no traceback for a peer's bytes
    log = a.log_text()
    assert "Traceback" not in log
    lines = [e for e in a.log_events("driver.penalized") if e["peer"] == attacker]
    assert len(lines) == len({e["reason"].split(":")[0] for e in lines})

    identify = Identify()
    identify.ParseFromString(_unframe(answer))
    assert identify.agent_version.startswith("symphony-node/")


def _unframe(frame: bytes) -> bytes:
    """The body of one varint-prefixed frame."""
    length = shift = 0
    for i, byte in enumerate(frame):
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            body = frame[i + 1:]
            assert len(body) == length
            return body
    raise AssertionError("no complete length prefix")
