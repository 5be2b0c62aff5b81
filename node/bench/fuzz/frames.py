"""What the fuzz attacker writes: hostile frames for each protocol a daemon serves.

A :class:`Target` is one served protocol id and how its frames look on the wire:

* ``framed``: our protocols (``/symphony/<net>/msg/1``, ``relay-chunks``, ``verify-states``),
  frames of a 4-byte big-endian length and a msgpack message (node/transport.py);
* ``varint``: py-libp2p's protobuf protocols (gossipsub ``/meshsub/*``, identify push), frames
  of an unsigned-varint length and a protobuf message (encoded here by hand, so this module
  needs no libp2p);
* ``raw``: ``/ipfs/ping/1.0.0``, 32-byte blocks that the daemon echoes.

Attack kinds (:data:`KINDS`), each a function of a seeded ``random.Random``:

* ``random``: random bytes; ``mutated``: a valid frame with bytes flipped, cut or inserted;
* ``bad_length``: a length prefix that lies (4 GiB, or longer than what follows);
* ``oversized``: a valid message larger than any frame limit (2 MiB);
* ``replay``: one valid, signed message, the same bytes every time;
* ``stall``: half a frame, then nothing (the attacker holds the stream open).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from crypto.keys import Identity
from node.p2p.pbwire import encode_varint
from protocol.codec import encode
from protocol.ledger.messages import LedgerPush
from protocol.ledger.records import (
    CAPABILITY_DOMAIN,
    CapabilityRecord,
    HardwareSummary,
    ModelOffer,
    Role,
)
from protocol.membership.messages import Hello
from protocol.relay.manifest import ChunkRequest, chunk_hash, make_body, sign_manifest
from protocol.verification.messages import StatesRequest

KINDS = ("random", "mutated", "bad_length", "oversized", "replay", "stall")
#: a valid message this much larger than the 1 MiB frame limit
OVERSIZED_BYTES = 2 << 20
#: short names of py-libp2p's protocol ids (any other id is named after its path)
LIBP2P_NAMES = {
    "/meshsub/1.0.0": "meshsub-1.0", "/meshsub/1.1.0": "meshsub-1.1",
    "/meshsub/1.2.0": "meshsub-1.2", "/ipfs/id/push/1.0.0": "identify-push",
    "/ipfs/id/1.0.0": "identify", "/ipfs/ping/1.0.0": "ping",
    "/libp2p/autonat/1.0.0": "autonat", "/libp2p/dcutr": "dcutr",
    "/libp2p/circuit/relay/0.2.0/hop": "relay-hop",
    "/libp2p/circuit/relay/0.2.0/stop": "relay-stop",
}
#: a valid message of each NAT traversal protocol (node/p2p/nat.py), protobuf by hand: AutoNAT
#: DIAL, relay RESERVE, stop CONNECT, DCUtR CONNECT
NAT_VALID = {"autonat": b"\x08\x00\x12\x00", "relay-hop": b"\x08\x00",
             "relay-stop": b"\x08\x00", "dcutr": b"\x08\x64"}
#: frames per stream where it is neither one (a request per stream) nor the default 64 (a
#: protocol the daemon keeps reading): a relay-chunks stream is a manifest, then requests
FRAMES_PER_STREAM = {"relay-chunks": 16}
PING_BYTES = 32


@dataclass(frozen=True)
class Target:
    name: str
    protocol_id: str
    framing: str
    #: valid payloads (unframed) to mutate and replay; the first is the replayed one
    valid: tuple[bytes, ...]
    #: frames written per stream before it is closed: 1 where the daemon reads one request
    frames_per_stream: int
    #: streams one attacking identity writes at once: within the daemon's per-protocol cap
    #: (16, and 2 for gossip), so the faults seen are the kind's own, not stream floods
    streams_at_once: int = 8


def short_name(protocol_id: str, network_id: str) -> str:
    """A protocol's name in the bench's figures: ``msg`` for ``/symphony/<net>/msg/1``,
    ``meshsub-1.2`` for ``/meshsub/1.2.0``, else the id's path joined by dashes."""
    if protocol_id in LIBP2P_NAMES:
        return LIBP2P_NAMES[protocol_id]
    for ours in (f"/symphony/{network_id}/", "/symphony/"):
        if protocol_id.startswith(ours) and protocol_id.endswith("/1"):
            return protocol_id[len(ours):-2].replace("/", "-")
    parts = [p for p in protocol_id.replace(".", "_").split("/") if p]
    return "-".join(parts) or "root"


def framing_of(protocol_id: str) -> str:
    """How the frames of ``protocol_id`` look: ``framed`` (ours: a 4-byte length and msgpack),
    ``raw`` (ping) or ``varint`` (every other libp2p protocol: varint length and protobuf)."""
    if protocol_id.startswith("/symphony/"):
        return "framed"
    return "raw" if protocol_id.startswith("/ipfs/ping/") else "varint"


def target_for(protocol_id: str, network_id: str, attacker: Identity, daemon_peer: str,
               now_ms: int) -> Target:
    """How to attack ``protocol_id``, with valid payloads built for ``attacker`` where the
    protocol is one this module knows (a generic valid message for any other)."""
    name, framing = short_name(protocol_id, network_id), framing_of(protocol_id)
    push = _ledger_push(attacker, network_id, now_ms)
    topic = f"symphony/{network_id}/ledger/1"
    valid: tuple[bytes, ...]
    if name == "relay-chunks":
        valid = _relay_frames(attacker, daemon_peer)
    elif name == "verify-states":
        valid = (encode(StatesRequest(task_id=b"\x01" * 32, states_root=b"\x02" * 32,
                                      leaves=(0, 1, 2))),)
    elif name == "handshake":
        valid = (encode(Hello(network_id=network_id, protocol_version=1, agent_version="fuzz",
                              listen_addrs=())),)
    elif framing == "framed":
        valid = (push,)
    elif framing == "raw":
        valid = (bytes(range(PING_BYTES)),)
    elif name.startswith("meshsub"):
        valid = (_rpc_publish(attacker, topic, push), _rpc_subscribe(topic))
    elif name in NAT_VALID:
        valid = (NAT_VALID[name],)
    else:  # identify, identify push, or a protobuf protocol this module does not know
        valid = (_identify(attacker),)
    # one request per stream on ours, identify and the NAT protocols (the daemon reads one
    # message and answers or resets); many on those it keeps reading (ping, gossip, pushes)
    per_stream = 1 if framing == "framed" or name == "identify" or name in NAT_VALID else 64
    return Target(name, protocol_id, framing, valid, FRAMES_PER_STREAM.get(name, per_stream),
                  2 if name.startswith("meshsub") else 8)


# ---------------------------------------------------------------- valid payloads


def _ledger_push(attacker: Identity, network_id: str, now_ms: int) -> bytes:
    record = CapabilityRecord(
        network_id=network_id, peer_id=attacker.peer_id, seq=now_ms, issued_at_ms=now_ms,
        expires_at_ms=now_ms + 15 * 60_000, listen_addrs=(),
        models=(ModelOffer(name="m", family="f", quantization="q4_1", context_length=2048,
                           weights_hash=bytes(32), tokens_per_s=10.0),),
        hardware=HardwareSummary(device_kind="cpu", device_name="fuzz", memory_bytes=1 << 30,
                                 cpu_cores=2),
        price_per_1k_tokens=1.0, free_slots=1, max_slots=1, load=0.0, roles=(Role.EXECUTOR,),
        tags=(), software_version="fuzz")
    from crypto.envelope import Envelope

    env = Envelope.sign(attacker, CAPABILITY_DOMAIN, encode(record))
    return encode(LedgerPush(records=(env,), attestations=(), reply=False, more=False))


def _relay_frames(attacker: Identity, daemon_peer: str) -> tuple[bytes, ...]:
    chunks = [bytes([i]) * 4096 for i in range(4)]
    body = make_body(name="fuzz", version=1, chunk_size=4096,
                     chunk_hashes=[chunk_hash(c) for c in chunks], total_size=4 * 4096,
                     publisher_upload_bps=1 << 20, recipients=[(daemon_peer, 1 << 20)])
    manifest = sign_manifest(attacker, body)
    request = ChunkRequest(manifest_id=manifest.id, index=0)
    return (encode(manifest.message), encode(request))


def _pb_field(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value


def _rpc_subscribe(topic: str) -> bytes:
    """A gossipsub RPC subscribing to ``topic`` (SubOpts: subscribe=1, topicid=2)."""
    return _pb_field(1, b"\x08\x01" + _pb_field(2, topic.encode()))


def _rpc_publish(attacker: Identity, topic: str, data: bytes) -> bytes:
    """A gossipsub RPC publishing ``data`` (unsigned: the daemon's strict signing refuses it)."""
    message = (_pb_field(1, attacker.peer_id.encode()) + _pb_field(2, data)
               + _pb_field(3, b"\x00" * 8) + _pb_field(4, topic.encode()))
    return _pb_field(2, message)


def _identify(attacker: Identity) -> bytes:
    """An identify message: agentVersion (6) and one protocol (3)."""
    return _pb_field(6, b"fuzz/1") + _pb_field(3, b"/fuzz/1")


# ---------------------------------------------------------------- framing and kinds


def frame(target: Target, payload: bytes) -> bytes:
    if target.framing == "framed":
        return len(payload).to_bytes(4, "big") + payload
    if target.framing == "varint":
        return encode_varint(len(payload)) + payload
    return payload


def _random(target: Target, rng: random.Random) -> bytes:
    if target.framing == "raw":
        return rng.randbytes(PING_BYTES)
    return frame(target, rng.randbytes(rng.randint(1, 512)))


def _mutated(target: Target, rng: random.Random) -> bytes:
    data = bytearray(rng.choice(target.valid))
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(max(1, len(data)))
        op = rng.randrange(3)
        if op == 0 and data:
            data[at] ^= rng.randint(1, 255)
        elif op == 1:
            del data[at:at + rng.randint(1, 8)]
        else:
            data[at:at] = rng.randbytes(rng.randint(1, 8))
    return frame(target, bytes(data))


def _bad_length(target: Target, rng: random.Random) -> bytes:
    body = rng.randbytes(rng.randint(0, 64))
    if target.framing == "framed":
        prefix = rng.choice([0xFFFFFFFF, 1 << 31, len(body) + rng.randint(1, 1000)])
        return prefix.to_bytes(4, "big") + body
    if target.framing == "varint":
        return encode_varint(rng.choice([1 << 32, 1 << 62, len(body) + 500])) + body
    return rng.randbytes(rng.randint(1, PING_BYTES - 1))  # a ping cut short


def _oversized(target: Target, rng: random.Random) -> bytes:
    if target.framing == "framed":
        blob = rng.randbytes(16) * (OVERSIZED_BYTES // 16)
        return frame(target, encode(StatesRequest(task_id=blob[:32], states_root=blob[:32],
                                                  leaves=())) + blob)
    if target.framing == "varint":
        return frame(target, _pb_field(2, _pb_field(2, b"\x00" * OVERSIZED_BYTES)))
    return b"\x00" * OVERSIZED_BYTES


def _replay(target: Target, rng: random.Random) -> bytes:
    return frame(target, target.valid[0])


def _stall(target: Target, rng: random.Random) -> bytes:
    whole = frame(target, target.valid[0])
    return whole[: max(1, len(whole) // 2)]


MAKERS: dict[str, Callable[[Target, random.Random], bytes]] = {
    "random": _random, "mutated": _mutated, "bad_length": _bad_length,
    "oversized": _oversized, "replay": _replay, "stall": _stall,
}
