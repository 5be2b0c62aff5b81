"""The gossip ledger machine (sans-IO): publish, merge, anti-entropy, rate limits, rejections.

Contract
--------
* Local events: ``SetCapability(spec)`` / ``SetLoad`` publish this node's signed record (seq =
  max(previous + 1, now), so a node that lost its data dir still moves forward), coalesced to
  one record per ``min_republish_ms`` and re-signed every ``refresh_ms``; ``Attest(...)`` signs,
  stores and publishes an attestation. Both go out as a ``LedgerPush`` on ``LEDGER_TOPIC``.
* Every received record and attestation is checked (protocol/ledger/records.py) and merged into
  the CRDT (protocol/ledger/state.py) by the ``LedgerIntake`` the machine holds
  (protocol/ledger/intake.py), which it calls for every peer message. A refused item is counted
  per peer and reason; each message's refusals become one ``Penalize`` per reason (the driver
  disconnects over its threshold). Peer data never raises out of ``handle``.
* Anti-entropy: on ``PeerConnected`` and every ``anti_entropy_ms`` (to ``sync_fanout`` random
  peers) we send a ``LedgerDigest``. A receiver that sees what it lacks pulls with
  ``LedgerSyncRequest`` in bounded batches; the holder answers with ``LedgerPush(reply=True,
  more=...)``. A receiver that sees the sender may lack something answers once with its own
  digest (``reply=True``, never answered). One pull per peer, ``max_concurrent_syncs`` at once,
  each bounded by ``sync_timeout_ms`` per round and ``max_sync_rounds``.
* Unsolicited attestations (gossip) are rate limited per sending peer; digests and requests
  too. Replies are accepted only for a request we have outstanding to that peer.
* Agent cards (protocol/ledger/cards.py): ``SetAgents(cards)`` publishes this node's one
  ``AgentCards`` record as the capability record is published; peers' records spread, sync,
  replace by seq and expire like capability records; ``RefuseAgentCards`` drops a held version
  found bad after intake (its vector) and penalizes its author.
* Effects beyond protocol/machine.py: ``StoreCapability``, ``StoreAttestation``,
  ``StoreAgentCards``, ``ForgetCapabilities``, ``ForgetAttestations``, ``ForgetAgentCards``
  (the driver persists them).
* Queries: ``machine.view`` (protocol/ledger/view.py: ``find_peers``, ``reputation``,
  ``attestations``, ``capability``, ``agents``, ``digest_hash``) and ``status(now)``.
* ``restore`` re-verifies stored envelopes at start-up and names those that no longer pass
  (protocol/ledger/restore.py).
* ``memo`` (protocol/machine.py): what every item goes through (envelope checks, hashes,
  peer ids, encodings, the state's per-item tuples); the simulator shares it across nodes.

Time: records carry Unix epoch milliseconds (they cross machines). Every ``now`` given to the
machine and its view is the driver's clock; ``clock_offset_ms`` maps it to the epoch (the daemon
passes wall-clock minus its monotonic clock at start; the simulator and tests pass 0).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from random import Random

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.codec import Message, decode, encode
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.ledger.cards import (
    ForgetAgentCards,
    OwnCards,
    RefuseAgentCards,
    SetAgents,
    StoreAgentCards,
)
from protocol.ledger.events import (
    Attest,
    CapabilitySpec,
    ForgetAttestations,
    ForgetCapabilities,
    LedgerConfig,
    SetCapability,
    SetLoad,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.intake import LedgerIntake
from protocol.ledger.messages import LEDGER_TOPIC, LedgerPush, LedgerSyncRequest
from protocol.ledger.records import (
    ATTESTATION_DOMAIN,
    CAPABILITY_DOMAIN,
    Attestation,
    CapabilityRecord,
    Rejected,
)
from protocol.ledger.restore import RestoreReport, restore_envelopes
from protocol.ledger.state import LedgerState
from protocol.ledger.sync import SyncSessions
from protocol.ledger.view import LedgerView
from protocol.machine import (
    Effect,
    Emit,
    Event,
    Memo,
    PeerConnected,
    PeerDisconnected,
    Publish,
    Received,
    Send,
    SendFailed,
    Tick,
    no_memo,
)

__all__ = [
    "Attest", "CapabilitySpec", "ForgetAgentCards", "ForgetAttestations", "ForgetCapabilities",
    "LedgerConfig", "LedgerMachine", "RefuseAgentCards", "RestoreReport", "SetAgents",
    "SetCapability", "SetLoad", "StoreAgentCards", "StoreAttestation", "StoreCapability",
]


class LedgerMachine:
    # one per simulated node: no per-instance dict; what every delivery reads comes first
    __slots__ = ("clock_offset_ms", "_next_anti_entropy", "intake", "state", "_sessions",
                 "_spec", "own_cards", "_connected", "_dirty", "_encode", "_own_seq",
                 "_published_at", "_stats", "config", "identity", "network_id", "peer_id", "rng",
                 "sync", "view")

    def __init__(
        self,
        identity: Identity,
        network_id: str,
        rng: Random,
        config: LedgerConfig | None = None,
        *,
        clock_offset_ms: int = 0,
        memo: Memo = no_memo,
    ) -> None:
        config = config if config is not None else LedgerConfig()
        self.identity = identity
        self.peer_id = identity.peer_id
        self.network_id = network_id
        self.config = config
        self.rng = rng
        self.state = LedgerState(
            observer_quota=config.observer_quota,
            max_records=config.max_records,
            max_attestations=config.max_attestations,
            tombstone_ms=config.max_record_ttl_ms,
            memo=memo,
        )
        self.sync = SyncSessions(self.state, config)
        self._sessions = self.sync.sessions  # read by next_deadline: one object, not two
        self.clock_offset_ms = clock_offset_ms
        self.view = LedgerView(self.state, self.peer_id, clock_offset_ms)
        self._stats: Counter[str] = Counter()
        self._spec: CapabilitySpec | None = None
        self._own_seq = 0
        self._published_at: int | None = None
        self._dirty = False
        self._connected: set[str] = set()
        self._next_anti_entropy: int | None = None
        #: this node's agent cards: signed, published, republished
        self.own_cards = OwnCards(identity, network_id, config, self.state.cards)
        #: what peers send: checked, rate limited, merged into ``state``, refusals counted
        self.intake = LedgerIntake(
            self.state,
            self.sync,
            config,
            network_id=network_id,
            peer_id=self.peer_id,
            stats=self._stats,
            on_own_record=self._saw_own_record,
            on_own_cards=self.own_cards.saw_own,
            memo=memo,
        )
        self._encode = memo(encode)

    @property
    def stats(self) -> Counter[str]:
        """What this machine did: bytes and messages sent, items accepted, rejections."""
        accepted = self.intake.accepted  # kept apart: bumped on every delivery
        if accepted is not None:
            self._stats["items_accepted"] = accepted
        return self._stats

    def rejections(self) -> dict[str, dict[str, int]]:
        """Refusals per peer and reason (protocol/ledger/intake.py)."""
        return self.intake.rejections()

    # ------------------------------------------------------------ machine contract

    def handle(self, event: Event, now: int) -> list[Effect]:
        now += self.clock_offset_ms
        if self._next_anti_entropy is None:
            self._next_anti_entropy = now + self.config.anti_entropy_ms
        if type(event) is Received:  # the common case first
            if event.topic is not None:  # gossip: never answered by a Send or Publish
                return self.intake.on_gossip(event.peer, event.message, now)
            effects = self.intake.on_received(event.peer, event.message, None, now)
        else:
            effects = self._dispatch(event, now)
        for effect in effects:
            if isinstance(effect, (Send, Publish)):
                self._stats["bytes_sent"] += len(self._encode(effect.message))
                self._stats["messages_sent"] += 1
        return effects

    def next_deadline(self) -> int | None:
        soonest = self.state.next_expiry()
        if self._sessions:  # (asked after every delivery: skip the call when idle)
            t = self.sync.next_deadline()
            if t is not None and (soonest is None or t < soonest):
                soonest = t
        if self._spec is not None and self._published_at is not None:
            t = self._published_at + (
                self.config.min_republish_ms if self._dirty else self.config.refresh_ms
            )
            if self._dirty:  # the sooner of the two (both configurable)
                t = min(t, self._published_at + self.config.refresh_ms)
            if soonest is None or t < soonest:
                soonest = t
        if self.own_cards.cards is not None:
            t = self.own_cards.next_deadline()
            if t is not None and (soonest is None or t < soonest):
                soonest = t
        if self._connected:
            t = self._next_anti_entropy
            if t is not None and (soonest is None or t < soonest):
                soonest = t
        return None if soonest is None else soonest - self.clock_offset_ms

    def _dispatch(self, event: Event, now: int) -> list[Effect]:
        if isinstance(event, Tick):
            return self._on_tick(now)
        if isinstance(event, Received):
            return self.intake.on_received(event.peer, event.message, event.topic, now)
        if isinstance(event, PeerConnected):
            self._connected.add(event.peer)
            return [self.sync.send_digest(event.peer, now, reply=False)]
        if isinstance(event, PeerDisconnected):
            self._connected.discard(event.peer)
            return self.sync.drop(event.peer, now)
        if isinstance(event, SendFailed):
            if isinstance(event.message, LedgerSyncRequest):
                return self.sync.drop(event.peer, now)
            return []
        if isinstance(event, SetCapability):
            self._check_spec(event.spec)
            self._spec = event.spec
            return self._maybe_publish_record(now, changed=True)
        if isinstance(event, SetLoad):
            if self._spec is None:
                raise LocalProtocolError("SetLoad before SetCapability")
            new = dataclasses.replace(self._spec, free_slots=event.free_slots, load=event.load)
            self._check_spec(new)
            changed, self._spec = new != self._spec, new
            return self._maybe_publish_record(now, changed=changed)
        if isinstance(event, Attest):
            return self._attest(event, now)
        if isinstance(event, SetAgents):
            return self.own_cards.set(event.cards, now)
        if isinstance(event, RefuseAgentCards):
            return self.intake.refuse_cards(event.peer_id, event.hash, event.reason)
        raise LocalProtocolError(f"the ledger machine does not handle {type(event).__name__}")

    # ------------------------------------------------------------ our own records

    def _saw_own_record(self, seq: int) -> None:
        """A peer sent a record of ours from a previous life: move past it (republish)."""
        self._own_seq = max(self._own_seq, seq)
        self._dirty = self._spec is not None

    def _record_from(self, spec: CapabilitySpec, seq: int, now: int) -> CapabilityRecord:
        ttl = min(self.config.record_ttl_ms, self.config.max_record_ttl_ms)
        return CapabilityRecord(
            network_id=self.network_id,
            peer_id=self.peer_id,
            seq=seq,
            issued_at_ms=now,
            expires_at_ms=now + ttl,
            **{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)},
        )

    @staticmethod
    def _checked(msg: Message) -> bytes:
        """Canonical bytes of our own payload, refused if peers would refuse it."""
        payload = encode(msg)
        try:
            decode(payload, type(msg))
        except InvalidMessage as exc:
            raise LocalProtocolError(f"invalid {type(msg).__name__}: {exc}") from None
        return payload

    def _check_spec(self, spec: CapabilitySpec) -> None:
        self._checked(self._record_from(spec, 0, 0))

    def _maybe_publish_record(self, now: int, *, changed: bool) -> list[Effect]:
        """Publish if our record changed (at most once per min_republish_ms) or is due."""
        self._dirty = self._dirty or changed
        if self._spec is None:
            return []
        last = self._published_at
        if (
            last is None
            or now >= last + self.config.refresh_ms
            or (self._dirty and now >= last + self.config.min_republish_ms)
        ):
            return self._publish_record(self._spec, now)
        return []

    def _publish_record(self, spec: CapabilitySpec, now: int) -> list[Effect]:
        self._own_seq = max(self._own_seq + 1, now)
        record = self._record_from(spec, self._own_seq, now)
        envelope = Envelope.sign(self.identity, CAPABILITY_DOMAIN, self._checked(record))
        self.state.merge_record(envelope, record, envelope.content_hash, now)
        self._published_at = now
        self._dirty = False
        push = LedgerPush(records=(envelope,), attestations=(), reply=False, more=False)
        return [StoreCapability(envelope, record), Publish(LEDGER_TOPIC, push)]

    def _attest(self, cmd: Attest, now: int) -> list[Effect]:
        if cmd.subject == self.peer_id:
            raise LocalProtocolError("a node may not attest itself")
        att = Attestation(
            network_id=self.network_id,
            subject=cmd.subject,
            object_id=cmd.object_id,
            kind=cmd.kind,
            outcome=cmd.outcome,
            evidence_hash=cmd.evidence_hash,
            amount=cmd.amount,
            observed_at_ms=now,
            expires_at_ms=now
            + min(self.config.attestation_ttl_ms, self.config.max_attestation_ttl_ms),
        )
        envelope = Envelope.sign(self.identity, ATTESTATION_DOMAIN, self._checked(att))
        h = envelope.content_hash
        try:
            new, evicted = self.state.merge_attestation(envelope, att, self.peer_id, h)
        except Rejected as exc:
            return [Emit("attestation_dropped", {"reason": exc.reason.value, "level": "warning"})]
        push = LedgerPush(records=(), attestations=(envelope,), reply=False, more=False)
        effects: list[Effect] = [StoreAttestation(envelope, att, h), Publish(LEDGER_TOPIC, push)]
        if evicted:
            effects.append(ForgetAttestations(tuple(evicted)))
        return effects if new else []

    # ------------------------------------------------------------ timers

    def _on_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        expiry = self.state.next_expiry()
        if expiry is not None and expiry <= now:
            peers, gone = self.state.prune(now)
            if peers:
                effects.append(ForgetCapabilities(tuple(peers)))
            if gone:
                effects.append(ForgetAttestations(tuple(h.hash for h in gone)))
            cards_gone = self.state.cards.prune(now)
            if cards_gone:
                effects.append(ForgetAgentCards(tuple(cards_gone)))
        effects += self._maybe_publish_record(now, changed=False)
        effects += self.own_cards.maybe_publish(now)
        effects += self.sync.on_tick(now)
        if self._next_anti_entropy is not None and now >= self._next_anti_entropy:
            self._next_anti_entropy = now + self.config.anti_entropy_ms
            peers_now = sorted(self._connected)
            for peer in self.rng.sample(peers_now, min(self.config.sync_fanout, len(peers_now))):
                effects.append(self.sync.send_digest(peer, now, reply=False))
        return effects

    # ------------------------------------------------------------ storage and status

    def restore(
        self,
        records: Iterable[bytes],
        attestations: Iterable[bytes],
        now: int,
        agents: Iterable[bytes] = (),
    ) -> RestoreReport:
        """Re-verify and merge stored envelopes (the bytes as received); produces no effects.

        Whatever no longer passes is reported (protocol/ledger/restore.py) so the store can
        delete it; our own records' seqs move ours forward.
        """
        report = restore_envelopes(
            self.state, self.intake, self.peer_id, records, attestations, agents,
            now + self.clock_offset_ms,
        )
        self._own_seq = max(self._own_seq, report.own_seq)
        self.own_cards.seq = max(self.own_cards.seq, report.own_cards_seq)
        return report

    def status(self, now: int) -> dict[str, object]:
        own = self.state.records.get(self.peer_id)
        epoch_now = now + self.clock_offset_ms
        return {
            "peer_id": self.peer_id,
            "records": len(self.state.records),
            "live_peers": sum(1 for _ in self.state.live_records(epoch_now)),
            "attestations": len(self.state.attestations),
            "agent_records": sum(1 for _ in self.state.cards.live(epoch_now)),
            "own_seq": own.record.seq if own is not None else None,
            "digest": self.view.digest_hash(now).hex(),
            "syncing": {p: s.state.value for p, s in sorted(self.sync.sessions.items())},
            "rejections": self.rejections(),
            "stats": dict(sorted(self.stats.items())),
        }
