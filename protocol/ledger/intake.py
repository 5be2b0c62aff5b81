"""What the ledger machine accepts from peers: pushes merged item by item, digests and sync
requests under per-peer rate limits, and refusals counted and turned into penalties.

Contract
--------
* ``LedgerIntake`` is the receiving half of protocol/ledger/machine.py's ``LedgerMachine``
  (which sets every attribute declared here). Peer data never raises out of it: a refused
  item is counted per peer and reason (``rejections()``), and each message's refusals become
  one ``Penalize`` per reason, capped at ``MAX_PENALTY_PER_MESSAGE`` points, plus one
  ``Emit("rejected")``.
* Gossip carries only unsolicited pushes of at most ``max_gossip_items``; a reply push is
  accepted only while we have a request outstanding to that peer. Unsolicited attestations,
  digests and sync requests are rate limited per sending peer (token buckets, per minute).
* Every record and attestation is checked by protocol/ledger/records.py and merged into the
  CRDT (protocol/ledger/state.py); what is new becomes ``StoreCapability`` /
  ``StoreAttestation``, what the observer quota evicts ``ForgetAttestations``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from crypto.envelope import Envelope
from protocol.codec import Message
from protocol.errors import LocalProtocolError
from protocol.ledger.events import (
    CapabilitySpec,
    ForgetAttestations,
    LedgerConfig,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.messages import LedgerDigest, LedgerPush, LedgerSyncRequest
from protocol.ledger.records import (
    PENALTY_POINTS,
    Rejected,
    Rejection,
    envelope_hash,
    open_attestation,
    open_capability,
)
from protocol.ledger.state import LedgerState
from protocol.ledger.sync import SyncSessions, build_reply
from protocol.machine import Effect, Emit, Penalize, Send

#: a message's penalty points per reason are capped at this (one bad batch is one offence)
MAX_PENALTY_PER_MESSAGE = 100
#: peers whose rejection counts are tracked separately; beyond, they pool under OTHER_PEERS
MAX_TRACKED_PEERS = 4096
OTHER_PEERS = "*"


@dataclass(slots=True)
class RateLimiter:
    """Token bucket per peer: ``per_minute`` tokens a minute, bursts up to ``per_minute``."""

    per_minute: int
    buckets: dict[str, tuple[float, int]] = field(default_factory=dict)

    def take(self, peer: str, now_ms: int) -> bool:
        buckets = self.buckets
        per_minute = self.per_minute
        held = buckets.get(peer)
        if held is None:
            tokens = float(per_minute)
        else:
            tokens = held[0] + (now_ms - held[1]) * per_minute / 60_000
            if tokens > per_minute:
                tokens = float(per_minute)
        if len(buckets) > MAX_TRACKED_PEERS:
            buckets.clear()  # a crowd of peers: forget history rather than grow
        if tokens < 1.0:
            buckets[peer] = (tokens, now_ms)
            return False
        buckets[peer] = (tokens - 1.0, now_ms)
        return True


def _count(counts: dict[Rejection, int], reason: Rejection) -> None:
    counts[reason] = counts.get(reason, 0) + 1


class LedgerIntake:
    """The receiving half of the ledger machine (see the module docstring)."""

    network_id: str
    peer_id: str
    config: LedgerConfig
    state: LedgerState
    sync: SyncSessions
    _stats: Counter[str]
    _accepted: int | None
    _rejections: dict[str, Counter[str]]
    _spec: CapabilitySpec | None
    _own_seq: int
    _dirty: bool
    _signers: dict[bytes, str]
    _attestation_ttl_ms: int
    _skew_ms: int
    _limits: dict[str, RateLimiter]
    _attestation_limiter: RateLimiter

    def _on_gossip(self, peer: str, msg: Message, now: int) -> list[Effect]:
        """A message on the ledger topic: an unsolicited push, merged item by item.

        What comes back is only Store*, Forget*, Penalize and Emit (nothing is sent).
        """
        rejected: dict[Rejection, int] = {}
        effects: list[Effect] = []
        if not isinstance(msg, LedgerPush):
            _count(rejected, Rejection.MALFORMED)  # only pushes travel by gossip
        elif msg.reply:
            _count(rejected, Rejection.UNSOLICITED)
        elif len(msg.records) + len(msg.attestations) > self.config.max_gossip_items:
            _count(rejected, Rejection.OVERSIZED)
        else:
            self._apply(peer, msg, now, False, effects, rejected)
        if rejected:
            effects += self._account(peer, rejected)
        return effects

    def _on_received(self, peer: str, msg: Message, topic: str | None, now: int) -> list[Effect]:
        if topic is not None:
            return self._on_gossip(peer, msg, now)
        rejected: dict[Rejection, int] = {}
        effects: list[Effect] = []
        if isinstance(msg, LedgerPush):
            solicited = msg.reply and self.sync.awaiting(peer)
            if msg.reply and not solicited:
                _count(rejected, Rejection.UNSOLICITED)
            elif (
                not solicited
                and len(msg.records) + len(msg.attestations) > self.config.max_gossip_items
            ):
                _count(rejected, Rejection.OVERSIZED)
            else:
                _, refused = self._apply(peer, msg, now, solicited, effects, rejected)
                if solicited:
                    effects += self.sync.on_reply(peer, msg, refused, now)
        elif isinstance(msg, LedgerDigest):
            if self._limits["digest"].take(peer, now):
                effects += self.sync.on_digest(peer, msg, now)
            else:
                _count(rejected, Rejection.RATE_LIMITED)
        elif isinstance(msg, LedgerSyncRequest):
            if self._limits["request"].take(peer, now):
                effects.append(Send(peer, build_reply(self.state, msg, self.config, now)))
            else:
                _count(rejected, Rejection.RATE_LIMITED)
        else:
            raise LocalProtocolError(f"the ledger was routed a {type(msg).__name__}")
        if rejected:
            effects += self._account(peer, rejected)
        return effects

    def _signer(self, envelope: Envelope) -> str:
        signer = self._signers.get(envelope.public_key)
        if signer is None:
            if len(self._signers) >= self.config.max_records:
                self._signers.clear()
            signer = self._signers[envelope.public_key] = envelope.signer
        return signer

    def _apply(
        self,
        peer: str,
        push: LedgerPush,
        now: int,
        solicited: bool,
        effects: list[Effect],
        rejected: dict[Rejection, int],
    ) -> tuple[int, list[bytes]]:
        """Merge a push: (new items, hashes of refused or evicted attestations)."""
        refused: list[bytes] = []
        new = self._merge_records(push.records, now, effects, rejected)
        new += self._merge_attestations(
            peer, push.attestations, now, solicited, effects, rejected, refused
        )
        accepted = self._accepted
        self._accepted = new if accepted is None else accepted + new
        return new, refused

    def _merge_records(
        self,
        envelopes: tuple[Envelope, ...],
        now: int,
        effects: list[Effect],
        rejected: dict[Rejection, int],
    ) -> int:
        """Check and merge pushed capability records: how many were new."""
        new = 0
        state = self.state
        for env in envelopes:
            h = envelope_hash(env)
            signer = self._signers.get(env.public_key) or self._signer(env)
            held = state.records.get(signer)
            if held is not None and held.hash == h:
                continue
            try:
                rec = open_capability(
                    env,
                    self.network_id,
                    now,
                    signer,
                    self.config.max_record_ttl_ms,
                    self.config.clock_skew_ms,
                )
                if state.merge_record(env, rec, h, now):
                    new += 1
                    effects.append(tuple.__new__(StoreCapability, (env, rec)))  # (as below)
                    if rec.peer_id == self.peer_id:  # ours from a previous life: move past it
                        self._own_seq = max(self._own_seq, rec.seq)
                        self._dirty = self._spec is not None
            except Rejected as exc:
                _count(rejected, exc.reason)
        return new

    def _merge_attestations(
        self,
        peer: str,
        envelopes: tuple[Envelope, ...],
        now: int,
        solicited: bool,
        effects: list[Effect],
        rejected: dict[Rejection, int],
        refused: list[bytes],
    ) -> int:
        """Check and merge pushed attestations (unsolicited ones rate limited per ``peer``):
        how many were new; the hashes of refused or evicted ones go to ``refused``."""
        new = 0
        state = self.state
        held_atts = state.attestations
        limiter = self._attestation_limiter
        signers = self._signers
        for env in envelopes:
            h = envelope_hash(env)
            if h in held_atts:
                continue
            if not solicited and not limiter.take(peer, now):
                _count(rejected, Rejection.RATE_LIMITED)
                continue
            try:
                signer = signers.get(env.public_key) or self._signer(env)
                att = open_attestation(
                    env, self.network_id, now, signer, self._attestation_ttl_ms, self._skew_ms
                )
                added, evicted = state.merge_attestation(env, att, signer, h)
            except Rejected as exc:
                _count(rejected, exc.reason)
                refused.append(h)
                continue
            if added:
                new += 1
                # StoreAttestation(env, att, h), without the named tuple's slower __new__
                effects.append(tuple.__new__(StoreAttestation, (env, att, h)))
            if evicted:
                refused.extend(evicted)
                effects.append(ForgetAttestations(evicted))
        return new

    def _account(self, peer: str, rejected: dict[Rejection, int]) -> list[Effect]:
        if not rejected:
            return []
        key = (
            peer
            if peer in self._rejections or len(self._rejections) < MAX_TRACKED_PEERS
            else OTHER_PEERS
        )
        counts = self._rejections.setdefault(key, Counter())
        effects: list[Effect] = []
        for reason, n in sorted(rejected.items(), key=lambda kv: kv[0].value):
            counts[reason.value] += n
            self._stats[f"rejected.{reason.value}"] += n
            points = min(PENALTY_POINTS[reason] * n, MAX_PENALTY_PER_MESSAGE)
            if points:
                effects.append(Penalize(peer, f"ledger:{reason.value}", points))
        effects.append(
            Emit(
                "rejected",
                {"peer": peer, "level": "warning", **{r.value: n for r, n in rejected.items()}},
            )
        )
        return effects

    def rejections(self) -> dict[str, dict[str, int]]:
        """Refusals per peer and reason (peers beyond MAX_TRACKED_PEERS pool under "*")."""
        return {peer: dict(sorted(c.items())) for peer, c in sorted(self._rejections.items())}
