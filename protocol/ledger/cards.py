"""Agent cards in the ledger: each node's one signed ``AgentCards`` record, replicated like its
capability record (sans-IO; the record itself and its checks are protocol/agents/cards.py).

Contract
--------
* :class:`CardRecords` is the replicated part, held by protocol/ledger/state.py's
  ``LedgerState`` (``state.cards``). Per node it keeps the record with the greatest
  ``(seq, content_hash)``; a lower one is a ``SEQ_REPLAY``, a new node past ``max_records`` is
  ``LEDGER_FULL``. An expired record stops counting (it leaves the digest and the view) and is
  kept as a tombstone until ``expires_at + tombstone_ms``, so an older one cannot be replayed
  while it is still valid. Merges commute, so every node that saw the same records holds the
  same ones.
* A version can be **refused after intake** (:meth:`CardRecords.refuse`): the node found that
  a card's vector is not its own description's, which takes an embedder the sans-IO machine
  does not have (node/agents/checks.py decides, the machine's ``RefuseAgentCards`` applies
  it). The version is dropped and remembered until its tombstone time: the same bytes are not
  merged or pulled again (their author was penalized once); only a newer seq of that node
  replaces them.
* :class:`OwnCards` publishes this node's cards (``SetAgents``): a new record, seq
  ``max(seq + 1, now)``, when they change (at most once per ``min_republish_ms``) and every
  ``refresh_ms``, with ``record_ttl_ms`` to live, as the capability record is republished.
* Local events ``SetAgents(cards)`` and ``RefuseAgentCards(peer_id, hash)``; effects
  ``StoreAgentCards(envelope, record)`` and ``ForgetAgentCards(peer_ids)`` (the driver
  persists them; node/ledger/store.py). protocol/ledger/machine.py re-exports them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.agents.cards import (
    MAX_AGENT_CARDS_BYTES,
    AgentCard,
    AgentCards,
    seal_agent_cards,
)
from protocol.codec import decode, encode
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.ledger.events import LedgerConfig
from protocol.ledger.expiry import pop_due, soonest
from protocol.ledger.messages import (
    LEDGER_TOPIC,
    MAX_DIGEST_RECORDS,
    PREFIX_LEN,
    LedgerPush,
    RecordVersion,
)
from protocol.ledger.records import MAX_RECORD_TTL_MS, CapabilityRecord, Rejected, Rejection
from protocol.machine import Effect, Publish

_NEVER = 1 << 62


# ---------------------------------------------------------------- events and effects


@dataclass(frozen=True, slots=True)
class SetAgents:
    """This node's agents changed (or are first known): sign and publish them."""

    cards: tuple[AgentCard, ...]


@dataclass(frozen=True, slots=True)
class RefuseAgentCards:
    """Drop ``peer_id``'s record whose envelope hash is ``hash`` and penalize its author for
    ``reason`` (nothing happens when that version is no longer held)."""

    peer_id: str
    hash: bytes
    reason: Rejection = Rejection.VECTOR_MISMATCH
    detail: str = ""


class StoreAgentCards(NamedTuple):
    """Persist ``envelope`` as ``record.peer_id``'s agent cards, replacing older ones."""

    envelope: Envelope
    record: AgentCards


@dataclass(frozen=True, slots=True)
class ForgetAgentCards:
    peer_ids: tuple[str, ...]


# ---------------------------------------------------------------- replicated state


R = TypeVar("R", bound=CapabilityRecord | AgentCards)


class Held(NamedTuple, Generic[R]):
    """One held version of a node's signed record: its capability record (protocol/ledger/
    state.py's ``HeldRecord``) or its agent cards (``HeldCards``). A named tuple: one is made
    per delivered version."""

    envelope: Envelope
    record: R
    hash: bytes
    #: our clock when this version first arrived (local display only, not replicated)
    received_at_ms: int

    def live(self, now_ms: int) -> bool:
        return self.record.expires_at_ms > now_ms


HeldCards = Held[AgentCards]


class CardRecords:
    """Every node's newest agent-card record (see the module docstring)."""
    # a simulator holds one per virtual node: no per-instance dict
    __slots__ = ("_versions", "expiry", "held", "max_records", "refused", "tombstone_ms", "version")


    def __init__(self, *, max_records: int = 10_000, tombstone_ms: int = MAX_RECORD_TTL_MS):
        self.max_records = max_records
        self.tombstone_ms = tombstone_ms
        self.held: dict[str, HeldCards] = {}
        #: node -> (seq, hash) of its version refused after intake, until its tombstone time
        self.refused: dict[str, tuple[int, bytes]] = {}
        #: bumped on every change (the digest cache compares it)
        self.version = 0
        #: heap of (forget at, node, hash), lazy (read, never changed, by LedgerState's
        #: ``next_expiry``, which is asked after every delivery: never rebound, it keeps it)
        self.expiry: list[tuple[int, str, bytes]] = []
        self._versions: tuple[int, int, int, tuple[RecordVersion, ...]] | None = None

    def newest(self, peer: str) -> tuple[int, bytes] | None:
        """The greatest ``(seq, hash)`` held or refused for ``peer``."""
        held = self.held.get(peer)
        mine = (held.record.seq, held.hash) if held is not None else None
        refused = self.refused.get(peer)
        if mine is None or (refused is not None and refused > mine):
            return refused
        return mine

    def merge(self, envelope: Envelope, record: AgentCards, h: bytes, now_ms: int) -> bool:
        """True if the record is new; False for one held or refused already; ``Rejected`` if
        it loses to what is held."""
        peer = record.peer_id
        held = self.held.get(peer)
        if (held is not None and held.hash == h) or self.refused.get(peer, (0, b""))[1] == h:
            return False
        best = self.newest(peer)
        if best is not None and (record.seq, h) < best:
            raise Rejected(Rejection.SEQ_REPLAY, f"agent cards seq {record.seq} <= {best[0]}")
        if held is None and len(self.held) >= self.max_records:
            raise Rejected(Rejection.LEDGER_FULL, f"{len(self.held)} agent records held")
        self.held[peer] = Held(envelope, record, h, now_ms)
        self.refused.pop(peer, None)
        heapq.heappush(self.expiry, (record.expires_at_ms + self.tombstone_ms, peer, h))
        self.version += 1
        return True

    def refuse(self, peer: str, h: bytes) -> HeldCards | None:
        """Drop ``peer``'s held version ``h`` and remember it as refused (None: not held)."""
        held = self.held.get(peer)
        if held is None or held.hash != h:
            return None
        del self.held[peer]
        self.refused[peer] = (held.record.seq, h)
        self.version += 1
        return held

    def prune(self, now_ms: int) -> list[str]:
        """Forget records (and refusals) past their tombstone time: the nodes whose went."""
        gone: list[str] = []
        for _, peer, h in pop_due(self.expiry, now_ms):
            held = self.held.get(peer)
            if held is not None and held.hash == h:
                del self.held[peer]
                self.version += 1
                gone.append(peer)
            elif self.refused.get(peer, (0, b""))[1] == h:
                del self.refused[peer]
        return gone

    def next_expiry(self) -> int | None:
        return soonest(self.expiry)

    def live(self, now_ms: int) -> Iterator[HeldCards]:
        """Unexpired records, by node id."""
        for peer in sorted(self.held):
            held = self.held[peer]
            if held.live(now_ms):
                yield held

    def versions(self, now_ms: int) -> tuple[tuple[RecordVersion, ...], int]:
        """The live versions a digest lists, and the time before which they stay valid."""
        cached = self._versions
        if cached is not None and cached[0] == self.version and cached[1] <= now_ms < cached[2]:
            return cached[3], cached[2]
        live = list(self.live(now_ms))
        versions = tuple(
            RecordVersion(
                peer_id=h.record.peer_id, seq=h.record.seq, hash_prefix=h.hash[:PREFIX_LEN]
            )
            for h in live[:MAX_DIGEST_RECORDS]
        )
        valid_before = min((h.record.expires_at_ms for h in live), default=_NEVER)
        self._versions = (self.version, now_ms, valid_before, versions)
        return versions, valid_before


# ---------------------------------------------------------------- our own cards


class OwnCards:
    """Signs and publishes this node's cards (see the module docstring)."""
    # a simulator holds one per virtual node: no per-instance dict
    __slots__ = ("cards", "config", "dirty", "identity", "network_id", "published_at", "records", "seq")


    def __init__(
        self, identity: Identity, network_id: str, config: LedgerConfig, records: CardRecords
    ) -> None:
        self.identity = identity
        self.network_id = network_id
        self.config = config
        self.records = records
        self.cards: tuple[AgentCard, ...] | None = None
        self.seq = 0
        self.published_at: int | None = None
        self.dirty = False

    def set(self, cards: tuple[AgentCard, ...], now: int) -> list[Effect]:
        """New cards from the operator; LocalProtocolError if peers would refuse them."""
        self._record(cards, self.seq, now)  # checks them before anything changes
        self.dirty = self.dirty or cards != self.cards
        self.cards = cards
        return self.maybe_publish(now)

    def saw_own(self, seq: int) -> None:
        """A record of ours from a previous life came back: move past its seq."""
        self.seq = max(self.seq, seq)
        self.dirty = self.cards is not None

    def next_deadline(self) -> int | None:
        if self.cards is None or self.published_at is None:
            return None
        due = self.published_at + self.config.refresh_ms
        if self.dirty:
            due = min(due, self.published_at + self.config.min_republish_ms)
        return due

    def maybe_publish(self, now: int) -> list[Effect]:
        if self.cards is None:
            return []
        due = self.next_deadline()
        if due is not None and now < due:
            return []
        return self._publish(self.cards, now)

    def _record(
        self, cards: tuple[AgentCard, ...], seq: int, now: int
    ) -> tuple[AgentCards, Envelope]:
        """The signed record of ``cards``, checked as a receiver checks it."""
        ttl = min(self.config.record_ttl_ms, self.config.max_record_ttl_ms)
        try:
            record = AgentCards(
                network_id=self.network_id,
                peer_id=self.identity.peer_id,
                seq=seq,
                issued_at_ms=now,
                expires_at_ms=now + ttl,
                cards=tuple(cards),
            )
            decode(encode(record), AgentCards, max_frame=MAX_AGENT_CARDS_BYTES)
            return record, seal_agent_cards(self.identity, record)
        except (InvalidMessage, ValueError) as exc:
            raise LocalProtocolError(f"invalid agent cards: {exc}") from None

    def _publish(self, cards: tuple[AgentCard, ...], now: int) -> list[Effect]:
        self.seq = max(self.seq + 1, now)
        record, envelope = self._record(cards, self.seq, now)
        self.records.merge(envelope, record, envelope.content_hash, now)
        self.published_at = now
        self.dirty = False
        push = LedgerPush(records=(), attestations=(), reply=False, more=False, agents=(envelope,))
        return [StoreAgentCards(envelope, record), Publish(LEDGER_TOPIC, push)]
