"""What the ledger machine accepts from peers: pushes merged item by item, digests and sync
requests under per-peer rate limits, and refusals counted and turned into penalties.

Contract
--------
* ``LedgerIntake`` is a helper object that protocol/ledger/machine.py's ``LedgerMachine``
  builds and calls for every message a peer sends; it merges into the machine's CRDT and
  sync sessions (given to its constructor) and owns only what intake needs of its own: the
  rate limiters, the signer cache, the refusal counts. Peer data never raises out of it: a refused
  item is counted per peer and reason (``rejections()``), and each message's refusals become
  one ``Penalize`` per reason, capped at ``MAX_PENALTY_PER_MESSAGE`` points, plus one
  ``Emit("rejected")``.
* Gossip carries only unsolicited pushes of at most ``max_gossip_items``; a reply push is
  accepted only while we have a request outstanding to that peer. Unsolicited attestations,
  digests and sync requests are rate limited per sending peer (token buckets, per minute).
* Every record and attestation is checked by protocol/ledger/records.py and merged into the
  CRDT (protocol/ledger/state.py); what is new becomes ``StoreCapability`` /
  ``StoreAttestation``, what the observer quota evicts ``ForgetAttestations``. A record of
  this node's own (from a previous life of its data dir) is passed to ``on_own_record``.
* Agent-card records (``LedgerPush.agents``) are checked by protocol/agents/cards.py and merged
  into ``state.cards`` the same way (``StoreAgentCards``; ours from a previous life go to
  ``on_own_cards``); a forged, oversized or malformed one is refused and costs the sender
  points like any bad record. ``refuse_cards`` refuses a held version after intake (its
  vector is not its description's) and penalizes its author.
* ``memo``: content hashes, envelope checks and peer ids go through it (protocol/machine.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from crypto.envelope import Envelope
from crypto.peer_id import peer_id_from_public_key
from protocol.agents.cards import AgentCards, open_agent_cards
from protocol.codec import Message
from protocol.errors import LocalProtocolError
from protocol.ledger.cards import ForgetAgentCards, StoreAgentCards
from protocol.ledger.events import (
    ForgetAttestations,
    LedgerConfig,
    StoreAttestation,
    store_capability,
)
from protocol.ledger.messages import LedgerDigest, LedgerPush, LedgerSyncRequest
from protocol.ledger.records import (
    PENALTY_POINTS,
    Attestation,
    CapabilityRecord,
    Rejected,
    Rejection,
    envelope_hash,
    open_attestation,
    open_capability,
    signed_attestation,
    signed_capability,
)
from protocol.ledger.state import LedgerState
from protocol.ledger.sync import SyncSessions, build_reply
from protocol.machine import Effect, Emit, Memo, Penalize, Send, no_memo

#: a message's penalty points per reason are capped at this (one bad batch is one offence)
MAX_PENALTY_PER_MESSAGE = 100
#: peers whose rejection counts are tracked separately; beyond, they pool under OTHER_PEERS
MAX_TRACKED_PEERS = 4096
OTHER_PEERS = "*"


class _Held(Protocol):
    @property
    def hash(self) -> bytes: ...


class _Signed(Protocol):
    """A signed record that names its author and its sequence number."""

    @property
    def peer_id(self) -> str: ...
    @property
    def seq(self) -> int: ...


SignedT = TypeVar("SignedT", bound=_Signed)


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


def _items(push: LedgerPush) -> int:
    return len(push.records) + len(push.attestations) + len(push.agents)


def _count(counts: dict[Rejection, int], reason: Rejection) -> None:
    counts[reason] = counts.get(reason, 0) + 1


@dataclass(frozen=True, slots=True)
class _Kind(Generic[SignedT]):
    """One kind of signed record a push carries (capabilities, agent cards): the held copy
    of a signer's record, how one is checked, merged and stored, what to do with our own."""

    held: Callable[[str], _Held | None]
    open: Callable[[Envelope, int], SignedT]
    merge: Callable[[Envelope, SignedT, bytes, int], bool]
    store: Callable[[Envelope, SignedT], Effect]
    on_own: Callable[[int], None]


class LedgerIntake:
    """What the ledger machine accepts from peers (see the module docstring)."""
    # one per simulated node: no per-instance dict; what every delivery reads comes first
    __slots__ = ("config", "state", "accepted", "_attestation_limiter", "_signers",
                 "_envelope_hash", "_signed_attestation", "network_id", "_attestation_ttl_ms",
                 "_skew_ms", "_kinds", "peer_id", "_limits", "_on_own_cards", "_on_own_record",
                 "_peer_id_of", "_rejections", "_signed_capability", "_stats", "sync")

    def __init__(
        self,
        state: LedgerState,
        sync: SyncSessions,
        config: LedgerConfig,
        *,
        network_id: str,
        peer_id: str,
        stats: Counter[str],
        on_own_record: Callable[[int], None],
        on_own_cards: Callable[[int], None],
        memo: Memo = no_memo,
    ) -> None:
        self.state = state
        self.sync = sync
        self.config = config
        self.network_id = network_id
        self.peer_id = peer_id
        #: the machine's counters: refusals are counted in as ``rejected.<reason>``
        self._stats = stats
        #: called with the seq of a record of ours a peer sent (ours from a previous life)
        self._on_own_record = on_own_record
        self._on_own_cards = on_own_cards
        #: items merged (the machine's stats["items_accepted"]; None: nothing delivered yet)
        self.accepted: int | None = None
        self._rejections: dict[str, Counter[str]] = {}
        self._signers: dict[bytes, str] = {}
        self._attestation_ttl_ms = config.max_attestation_ttl_ms
        self._skew_ms = config.clock_skew_ms
        self._limits = {
            "attestation": RateLimiter(config.attestation_rate_per_minute),
            "digest": RateLimiter(config.digest_rate_per_minute),
            "request": RateLimiter(config.request_rate_per_minute),
        }
        self._attestation_limiter = self._limits["attestation"]
        self._envelope_hash = memo(envelope_hash)
        self._signed_capability = memo(signed_capability)
        self._signed_attestation = memo(signed_attestation)
        self._peer_id_of = memo(peer_id_from_public_key)
        self._kinds = (
            _Kind(state.records.get, self.open_record, state.merge_record, store_capability,
                  on_own_record),
            _Kind(state.cards.held.get, self.open_cards, state.cards.merge, StoreAgentCards,
                  on_own_cards),
        )

    def on_gossip(self, peer: str, msg: Message, now: int) -> list[Effect]:
        """A message on the ledger topic: an unsolicited push, merged item by item.

        What comes back is only Store*, Forget*, Penalize and Emit (nothing is sent).
        """
        rejected: dict[Rejection, int] = {}
        effects: list[Effect] = []
        if not isinstance(msg, LedgerPush):
            _count(rejected, Rejection.MALFORMED)  # only pushes travel by gossip
        elif msg.reply:
            _count(rejected, Rejection.UNSOLICITED)
        elif _items(msg) > self.config.max_gossip_items:
            _count(rejected, Rejection.OVERSIZED)
        else:
            self._apply(peer, msg, now, False, effects, rejected)
        if rejected:
            effects += self._account(peer, rejected)
        return effects

    def on_received(self, peer: str, msg: Message, topic: str | None, now: int) -> list[Effect]:
        """A message from ``peer`` (``topic``: by gossip, else sent to us)."""
        if topic is not None:
            return self.on_gossip(peer, msg, now)
        rejected: dict[Rejection, int] = {}
        effects: list[Effect] = []
        if isinstance(msg, LedgerPush):
            solicited = msg.reply and self.sync.awaiting(peer)
            if msg.reply and not solicited:
                if not self.sync.late_reply(peer, now):  # a late one is no fault (sync.py)
                    _count(rejected, Rejection.UNSOLICITED)
            elif not solicited and _items(msg) > self.config.max_gossip_items:
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

    def signer(self, envelope: Envelope) -> str:
        """The peer id of ``envelope``'s key, remembered (bounded) per key."""
        signer = self._signers.get(envelope.public_key)
        if signer is None:
            if len(self._signers) >= self.config.max_records:
                self._signers.clear()
            signer = self._signers[envelope.public_key] = self._peer_id_of(envelope.public_key)
        return signer

    def open_record(self, env: Envelope, now: int) -> CapabilityRecord:
        """Check a stored capability record as a pushed one is checked (raises Rejected)."""
        return open_capability(env, self.network_id, now, self.signer(env),
                               self.config.max_record_ttl_ms, self.config.clock_skew_ms,
                               self._signed_capability)

    def open_cards(self, env: Envelope, now: int) -> AgentCards:
        """Check a stored agent-card record as a pushed one is checked (raises Rejected)."""
        return open_agent_cards(
            env, self.network_id, now, self.signer(env),
            self.config.max_record_ttl_ms, self.config.clock_skew_ms,
        )

    def refuse_cards(self, peer: str, h: bytes, reason: Rejection) -> list[Effect]:
        """Drop ``peer``'s held agent cards of hash ``h`` and penalize ``peer``, their author
        (nothing when that version is no longer held: replaced or expired meanwhile)."""
        if self.state.cards.refuse(peer, h) is None:
            return []
        return [ForgetAgentCards((peer,)), *self._account(peer, {reason: 1})]

    def open_attestation(self, env: Envelope, now: int) -> Attestation:
        """Check a stored attestation as a pushed one is checked (raises Rejected)."""
        return open_attestation(env, self.network_id, now, self.signer(env),
                                self.config.max_attestation_ttl_ms, self.config.clock_skew_ms,
                                self._signed_attestation)

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
        # most pushes carry one kind of item: an empty one costs no call (nor a read of
        # ``_kinds``, one more object per delivery to a simulator's node)
        new = 0
        if push.records:
            new = self._merge_signed(self._kinds[0], push.records, now, effects, rejected)
        if push.agents:
            new += self._merge_signed(self._kinds[1], push.agents, now, effects, rejected)
        if push.attestations:
            new += self._merge_attestations(
                peer, push.attestations, now, solicited, effects, rejected, refused
            )
        accepted = self.accepted
        self.accepted = new if accepted is None else accepted + new
        return new, refused

    def _merge_signed(
        self,
        kind: _Kind[Any],
        envelopes: tuple[Envelope, ...],
        now: int,
        effects: list[Effect],
        rejected: dict[Rejection, int],
    ) -> int:
        """Check and merge pushed capability or agent-card records: how many were new."""
        new = 0
        envelope_hash, signers = self._envelope_hash, self._signers
        for env in envelopes:
            h = envelope_hash(env)
            held = kind.held(signers.get(env.public_key) or self.signer(env))
            if held is not None and held.hash == h:
                continue
            try:
                rec = kind.open(env, now)
                if kind.merge(env, rec, h, now):
                    new += 1
                    effects.append(kind.store(env, rec))
                    if rec.peer_id == self.peer_id:  # ours from a previous life: move past it
                        kind.on_own(rec.seq)
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
        envelope_hash, signed = self._envelope_hash, self._signed_attestation
        for env in envelopes:
            h = envelope_hash(env)
            if h in held_atts:
                continue
            if not solicited and not limiter.take(peer, now):
                _count(rejected, Rejection.RATE_LIMITED)
                continue
            try:
                signer = signers.get(env.public_key) or self.signer(env)
                att = open_attestation(
                    env, self.network_id, now, signer, self._attestation_ttl_ms, self._skew_ms,
                    signed,
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
