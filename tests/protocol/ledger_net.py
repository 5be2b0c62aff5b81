"""Test helpers for the ledger: identities, signed records and attestations, and an in-memory
network that carries the machines' Send/Publish effects (through the real codec) to each other.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.codec import decode, encode
from protocol.ledger.machine import CapabilitySpec, LedgerConfig, LedgerMachine
from protocol.ledger.messages import LEDGER_TOPIC, LedgerPush
from protocol.ledger.records import (
    ATTESTATION_DOMAIN,
    CAPABILITY_DOMAIN,
    Attestation,
    AttestationKind,
    CapabilityRecord,
    HardwareSummary,
    ModelOffer,
    Role,
)
from protocol.machine import PeerConnected, PeerDisconnected, Publish, Received, Send, Tick

NET = "testnet"
T0 = 1_700_000_000_000
MINUTE = 60_000
HOUR = 60 * MINUTE


def identity(i: int) -> Identity:
    return Identity.from_seed(i.to_bytes(32, "big"))


def offer(
    name: str = "smollm2-135m", family: str = "smollm2", tps: float = 37.0, ctx: int = 2048
) -> ModelOffer:
    return ModelOffer(
        name=name,
        family=family,
        quantization="q4_1",
        context_length=ctx,
        weights_hash=bytes(32),
        tokens_per_s=tps,
    )


HARDWARE = HardwareSummary(device_kind="cpu", device_name="test", memory_bytes=1 << 30, cpu_cores=2)


def spec(**kw: object) -> CapabilitySpec:
    base: dict[str, object] = dict(
        listen_addrs=("/ip4/127.0.0.1/tcp/4001",),
        models=(offer(),),
        hardware=HARDWARE,
        price_per_1k_tokens=0.5,
        free_slots=2,
        max_slots=2,
        load=0.0,
        roles=(Role.EXECUTOR, Role.VERIFIER),
        tags=("test",),
        software_version="0.1.0",
    )
    base.update(kw)
    return CapabilitySpec(**base)  # type: ignore[arg-type]


def record(
    signer: Identity,
    seq: int,
    *,
    now: int = T0,
    ttl: int = 15 * MINUTE,
    network: str = NET,
    peer_id: str | None = None,
    domain: str = CAPABILITY_DOMAIN,
    **kw: object,
) -> Envelope:
    fields: dict[str, object] = dict(
        network_id=network,
        peer_id=peer_id if peer_id is not None else signer.peer_id,
        seq=seq,
        issued_at_ms=now,
        expires_at_ms=now + ttl,
        listen_addrs=(),
        models=(offer(),),
        hardware=HARDWARE,
        price_per_1k_tokens=1.0,
        free_slots=1,
        max_slots=1,
        load=0.0,
        roles=(Role.EXECUTOR,),
        tags=(),
        software_version="0.1.0",
    )
    fields.update(kw)
    rec = CapabilityRecord(**fields)  # type: ignore[arg-type]
    return Envelope.sign(signer, domain, encode(rec))


def attestation(
    observer: Identity,
    subject: str,
    *,
    kind: AttestationKind = AttestationKind.TASK_COMPLETED,
    now: int = T0,
    ttl: int = 24 * HOUR,
    object_id: bytes = b"task-1",
    network: str = NET,
    evidence: bytes = b"",
    amount: int = 0,
    domain: str = ATTESTATION_DOMAIN,
) -> Envelope:
    if kind in (AttestationKind.VERIFICATION_FAILED, AttestationKind.VERDICT_CONTRADICTED,
                AttestationKind.RELAY_BAD_CHUNK):
        evidence = evidence or bytes(range(32))
    att = Attestation(
        network_id=network,
        subject=subject,
        object_id=object_id,
        kind=kind,
        outcome="",
        evidence_hash=evidence,
        amount=amount,
        observed_at_ms=now,
        expires_at_ms=now + ttl,
    )
    return Envelope.sign(observer, domain, encode(att))


def gossip(records: Iterable[Envelope] = (), atts: Iterable[Envelope] = ()) -> LedgerPush:
    return LedgerPush(records=tuple(records), attestations=tuple(atts), reply=False, more=False)


def machine(i: int, config: LedgerConfig | None = None, seed: int = 0) -> LedgerMachine:
    return LedgerMachine(identity(i), NET, random.Random(seed + i), config)


@dataclass
class Net:
    """Carries effects between machines in FIFO order; messages go through encode/decode."""

    now: int = T0
    machines: dict[str, LedgerMachine] = field(default_factory=dict)
    links: set[frozenset[str]] = field(default_factory=set)
    queue: deque[tuple[str, object]] = field(default_factory=deque)
    #: every non-network effect, per node
    performed: dict[str, list[object]] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)
    #: messages whose delivery is suppressed (peer id -> True): a silent peer
    silent: set[str] = field(default_factory=set)

    def add(self, m: LedgerMachine) -> LedgerMachine:
        self.machines[m.peer_id] = m
        self.performed[m.peer_id] = []
        return m

    def feed(self, peer: str, event: object) -> None:
        for effect in self.machines[peer].handle(event, self.now):
            self.queue.append((peer, effect))

    def connect(self, a: str, b: str) -> None:
        self.links.add(frozenset((a, b)))
        self.feed(a, PeerConnected(b))
        self.feed(b, PeerConnected(a))

    def disconnect(self, a: str, b: str) -> None:
        self.links.discard(frozenset((a, b)))
        self.feed(a, PeerDisconnected(b))
        self.feed(b, PeerDisconnected(a))

    def run(self, max_steps: int = 100_000) -> int:
        steps = 0
        while self.queue:
            steps += 1
            if steps > max_steps:
                raise AssertionError("the network did not go quiet")
            src, effect = self.queue.popleft()
            if isinstance(effect, Send):
                self.sent[type(effect.message).__name__] += 1
                if frozenset((src, effect.peer)) in self.links and effect.peer not in self.silent:
                    msg = decode(encode(effect.message))
                    self.feed(effect.peer, Received(src, msg))
            elif isinstance(effect, Publish):
                assert effect.topic == LEDGER_TOPIC
                self.sent["publish"] += 1
                for link in sorted(self.links, key=sorted):
                    if src in link:
                        (dst,) = link - {src}
                        if dst not in self.silent:
                            self.feed(
                                dst, Received(src, decode(encode(effect.message)), LEDGER_TOPIC)
                            )
            else:
                self.performed[src].append(effect)
        return steps

    def advance(self, to: int) -> None:
        """Move the clock to ``to``, ticking every machine whose deadline passed, in order."""
        for _ in range(100_000):
            due = [
                (d, p)
                for p, m in sorted(self.machines.items())
                if (d := m.next_deadline()) is not None and d <= to
            ]
            if not due:
                self.now = to
                return
            d, p = min(due)
            self.now = max(self.now, d)
            self.feed(p, Tick())
            self.run()
        raise AssertionError("deadlines never passed beyond the clock")

    def digests(self) -> set[bytes]:
        return {m.view.digest_hash(self.now) for m in self.machines.values()}
