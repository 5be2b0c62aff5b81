"""Anti-entropy for the ledger: digests, pull sessions, and answers to pulls (sans-IO).

Per peer, a pull session moves through ``SyncState`` (no session object means IDLE)::

    IDLE --digest shows we lack something--> QUEUED --slot free, request sent--> PULLING
    PULLING --reply with items and (more, or our request was truncated)--> PULLING
    PULLING --reply empty / complete, timeout, send failure, disconnect--> IDLE
    QUEUED --nothing left to ask, disconnect--> IDLE

What we ask for: the peers whose record version in the digest beats ours (capability records
and, apart, agent-card records: one held or refused counts as ours), and the attestation
buckets whose summary hash differs, each with the hash prefixes we already hold there (plus
those we refused during this session, so they are not sent again). The holder answers with at
most ``batch_attestations`` items / ``batch_bytes`` and says whether it stopped early. Every
round is bounded in time (``sync_timeout_ms``) and a session in rounds (``max_sync_rounds``):
a session always ends, whatever the peer sends. A reply that comes after we gave up on it (its
round timed out, or its request's send reported failed: a peer short of CPU answers late, and
a send can fail after the request went out) is no fault within ``LATE_REPLY_MS``; it is
dropped unmerged (:meth:`SyncSessions.late_reply`), and the next digest asks again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from crypto.envelope import Envelope
from protocol.errors import LocalProtocolError
from protocol.late import GivenUp
from protocol.ledger.events import LedgerConfig
from protocol.ledger.messages import (
    BUCKETS,
    MAX_DIGEST_RECORDS,
    MAX_HAVE_PREFIXES,
    MAX_PUSH_AGENTS,
    MAX_PUSH_ATTESTATIONS,
    MAX_PUSH_RECORDS,
    MAX_REQUEST_AGENTS,
    MAX_REQUEST_RECORDS,
    PREFIX_LEN,
    BucketHave,
    LedgerDigest,
    LedgerPush,
    LedgerSyncRequest,
)
from protocol.ledger.state import LedgerState
from protocol.machine import Effect, Emit, Send

_EMPTY = bytes(PREFIX_LEN)
#: overhead of an envelope around its payload on the wire (key, signature, domain, framing)
_ENVELOPE_OVERHEAD = 32 + 64 + 64 + 16


class SyncState(enum.Enum):
    IDLE = "idle"
    QUEUED = "queued"
    PULLING = "pulling"


TRANSITIONS: dict[SyncState, frozenset[SyncState]] = {
    SyncState.IDLE: frozenset({SyncState.QUEUED}),
    SyncState.QUEUED: frozenset({SyncState.PULLING, SyncState.IDLE}),
    SyncState.PULLING: frozenset({SyncState.PULLING, SyncState.IDLE}),
}


@dataclass(slots=True)
class _Session:
    their: LedgerDigest
    state: SyncState = SyncState.IDLE
    awaiting: bool = False
    deadline_ms: int | None = None
    rounds: int = 0
    received: int = 0
    truncated: bool = False
    refused: dict[int, set[bytes]] = field(default_factory=dict)  # bucket -> prefixes
    #: peers whose records we asked for once this session (asked again only in a new session)
    asked_peers: set[str] = field(default_factory=set)
    #: likewise for agent-card records
    asked_agents: set[str] = field(default_factory=set)


def envelope_size(envelope: Envelope) -> int:
    return len(envelope.payload) + _ENVELOPE_OVERHEAD


#: a reply this long after we gave up awaiting it is still no fault (module doc)
LATE_REPLY_MS = 60_000


class SyncSessions:
    # a simulator holds one per virtual node: no per-instance dict
    __slots__ = ("_digest_sent_at", "_gave_up", "config", "sessions", "state")

    def __init__(self, state: LedgerState, config: LedgerConfig) -> None:
        self.state = state
        self.config = config
        self.sessions: dict[str, _Session] = {}  # never rebound: the machine keeps it
        self._digest_sent_at: dict[str, int] = {}
        #: pulls we stopped awaiting: their late replies are no fault (module doc)
        self._gave_up = GivenUp(LATE_REPLY_MS)

    # ------------------------------------------------------------ queries

    def awaiting(self, peer: str) -> bool:
        s = self.sessions.get(peer)
        return s is not None and s.awaiting

    def late_reply(self, peer: str, now: int) -> bool:
        """Whether a reply from ``peer`` we no longer await answers a request we gave up on
        less than LATE_REPLY_MS ago (once per request: a second one is unsolicited)."""
        return self._gave_up.excuses(peer, now)

    def next_deadline(self) -> int | None:
        if not self.sessions:
            return None
        times = [s.deadline_ms for s in self.sessions.values() if s.awaiting and s.deadline_ms]
        return min(times) if times else None

    def wanted(self, d: LedgerDigest, now: int) -> tuple[list[str], list[int]]:
        """Peers whose record in ``d`` beats ours, and buckets whose summary differs."""
        peers: list[str] = []
        seen: set[str] = set()
        for rv in d.records:
            if rv.peer_id in seen:
                continue
            held = self.state.records.get(rv.peer_id)
            if held is None or (rv.seq, rv.hash_prefix) > (held.record.seq, held.hash[:PREFIX_LEN]):
                peers.append(rv.peer_id)
                seen.add(rv.peer_id)
        buckets: list[int] = []
        summary = d.attestation_buckets
        if summary:
            ours = self.state.bucket_summary()  # b"" when we hold none: every bucket differs
            if summary != ours:
                for b in range(BUCKETS):
                    lo = b * PREFIX_LEN
                    theirs = summary[lo : lo + PREFIX_LEN]
                    if theirs != _EMPTY and theirs != ours[lo : lo + PREFIX_LEN]:
                        buckets.append(b)
        return peers, buckets

    def wanted_agents(self, d: LedgerDigest) -> list[str]:
        """Nodes whose agent-card version in ``d`` beats what we hold or refused."""
        cards = self.state.cards
        peers: list[str] = []
        for rv in d.agents:
            ours = cards.newest(rv.peer_id)
            if ours is None or (rv.seq, rv.hash_prefix) > (ours[0], ours[1][:PREFIX_LEN]):
                if rv.peer_id not in peers:
                    peers.append(rv.peer_id)
        return peers

    def _they_may_lack(self, d: LedgerDigest, now: int) -> bool:
        their_cards = {rv.peer_id: (rv.seq, rv.hash_prefix) for rv in d.agents}
        for held_cards in self.state.cards.live(now):
            version = (held_cards.record.seq, held_cards.hash[:PREFIX_LEN])
            if their_cards.get(held_cards.record.peer_id, (-1, b"")) < version:
                return True
        theirs: dict[str, tuple[int, bytes]] = {}
        for rv in d.records:
            theirs[rv.peer_id] = max(theirs.get(rv.peer_id, (-1, b"")), (rv.seq, rv.hash_prefix))
        for held in self.state.live_records(now):
            if theirs.get(held.record.peer_id, (-1, b"")) < (
                held.record.seq,
                held.hash[:PREFIX_LEN],
            ):
                return True
        ours = self.state.bucket_summary()
        if not ours:
            return False
        if not d.attestation_buckets:
            return True
        if ours == d.attestation_buckets:
            return False
        for b in range(BUCKETS):
            mine = ours[b * PREFIX_LEN : (b + 1) * PREFIX_LEN]
            if (
                mine != _EMPTY
                and mine != d.attestation_buckets[b * PREFIX_LEN : (b + 1) * PREFIX_LEN]
            ):
                return True
        return False

    # ------------------------------------------------------------ events

    def send_digest(self, peer: str, now: int, *, reply: bool) -> Send:
        self._digest_sent_at[peer] = now
        d = self.state.digest(now)
        if not reply:
            return Send(peer, d)  # the state's (shared) digest: reply is false in it
        return Send(peer, replace(d, reply=True))

    def on_digest(self, peer: str, d: LedgerDigest, now: int) -> list[Effect]:
        ours = self.state.digest(now)
        if (
            len(ours.records) < MAX_DIGEST_RECORDS  # (a full digest may leave records out)
            and d.attestation_buckets == ours.attestation_buckets
            and d.records == ours.records
            and d.agents == ours.agents
        ):
            return []  # the peer holds what we hold: neither side lacks anything
        effects: list[Effect] = []
        last = self._digest_sent_at.get(peer)
        if (
            not d.reply
            and (last is None or now - last >= self.config.digest_reply_min_ms)
            and self._they_may_lack(d, now)
        ):
            effects.append(self.send_digest(peer, now, reply=True))
        peers, buckets = self.wanted(d, now)
        if peers or buckets or self.wanted_agents(d):
            s = self.sessions.get(peer)
            if s is None:
                s = self.sessions[peer] = _Session(their=d)
                self._move(s, SyncState.QUEUED)
            else:
                s.their = d
            effects += self._start_queued(now)
        return effects

    def on_reply(self, peer: str, push: LedgerPush, refused: list[bytes], now: int) -> list[Effect]:
        s = self.sessions[peer]
        s.awaiting = False
        for h in refused:
            s.refused.setdefault(h[0], set()).add(h[:PREFIX_LEN])
        items = len(push.records) + len(push.attestations)
        s.received += items
        if items and (push.more or s.truncated) and s.rounds < self.config.max_sync_rounds:
            request = self._request(s, now)
            if request is not None:
                self._move(s, SyncState.PULLING)
                s.rounds += 1
                s.awaiting = True
                s.deadline_ms = now + self.config.sync_timeout_ms
                return [Send(peer, request)]
        return self._end(peer, now, "complete")

    def on_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for peer, s in list(self.sessions.items()):
            if s.awaiting and s.deadline_ms is not None and s.deadline_ms <= now:
                effects += self._end(peer, now, "timeout")
        return effects

    def drop(self, peer: str, now: int) -> list[Effect]:
        self._digest_sent_at.pop(peer, None)
        if peer not in self.sessions:
            return []
        return self._end(peer, now, "dropped")

    # ------------------------------------------------------------ internals

    @staticmethod
    def _move(s: _Session, new: SyncState) -> None:
        if new not in TRANSITIONS[s.state]:
            raise LocalProtocolError(f"sync session cannot go {s.state.value} -> {new.value}")
        s.state = new

    def _end(self, peer: str, now: int, why: str) -> list[Effect]:
        s = self.sessions.pop(peer)
        if s.awaiting and why != "complete":
            self._gave_up.add(peer, now)
        self._move(s, SyncState.IDLE)
        done = Emit(
            "sync_end", {"peer": peer, "why": why, "rounds": s.rounds, "items": s.received}
        )
        return [done, *self._start_queued(now)]

    def _start_queued(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        active = sum(1 for s in self.sessions.values() if s.state is SyncState.PULLING)
        for peer, s in list(self.sessions.items()):
            if active >= self.config.max_concurrent_syncs:
                break
            if s.state is not SyncState.QUEUED:
                continue
            request = self._request(s, now)
            if request is None:
                self.sessions.pop(peer)
                self._move(s, SyncState.IDLE)
                continue
            self._move(s, SyncState.PULLING)
            s.rounds, s.awaiting, s.deadline_ms = 1, True, now + self.config.sync_timeout_ms
            effects.append(Send(peer, request))
            active += 1
        return effects

    def _request(self, s: _Session, now: int) -> LedgerSyncRequest | None:
        peers, buckets = self.wanted(s.their, now)
        peers = [p for p in peers if p not in s.asked_peers]
        truncated = len(peers) > MAX_REQUEST_RECORDS
        peers = peers[:MAX_REQUEST_RECORDS]
        agents = [p for p in self.wanted_agents(s.their) if p not in s.asked_agents]
        truncated = truncated or len(agents) > MAX_REQUEST_AGENTS
        agents = agents[:MAX_REQUEST_AGENTS]
        haves: list[BucketHave] = []
        budget = self.config.request_have_bytes
        for b in buckets:
            prefixes = [h[:PREFIX_LEN] for h in self.state.bucket(b)]
            prefixes += sorted(s.refused.get(b, ()))
            have = b"".join(prefixes[:MAX_HAVE_PREFIXES])
            if haves and len(have) > budget:
                truncated = True
                break
            haves.append(BucketHave(bucket=b, have=have))
            budget -= len(have)
        if not peers and not haves and not agents:
            return None
        s.truncated = truncated
        s.asked_peers.update(peers)
        s.asked_agents.update(agents)
        return LedgerSyncRequest(
            records=tuple(peers),
            buckets=tuple(haves),
            max_attestations=min(self.config.batch_attestations, MAX_PUSH_ATTESTATIONS),
            agents=tuple(agents),
        )


@dataclass(slots=True)
class _Budget:
    """The bytes a push may still carry."""

    left: int

    def take(self, into: list[Envelope], envelope: Envelope, limit: int) -> bool:
        """Append ``envelope`` to ``into`` unless ``into`` holds ``limit`` already or the
        envelope is larger than what is left; False: the push is full."""
        size = envelope_size(envelope)
        if len(into) >= limit or size > self.left:
            return False
        into.append(envelope)
        self.left -= size
        return True


def build_reply(
    state: LedgerState, req: LedgerSyncRequest, config: LedgerConfig, now: int
) -> LedgerPush:
    """Our answer to a pull: the live records and agent cards asked for (cards while the byte
    budget lasts), and attestations the asker lacks."""
    records: list[Envelope] = []
    budget = _Budget(config.batch_bytes)
    for peer in dict.fromkeys(req.records):
        held = state.records.get(peer)
        if held is not None and held.live(now) and len(records) < MAX_PUSH_RECORDS:
            records.append(held.envelope)
            budget.left -= envelope_size(held.envelope)  # records are sent even past the budget
    agents: list[Envelope] = []
    cards_left = False
    for peer in dict.fromkeys(req.agents):
        held_cards = state.cards.held.get(peer)
        if held_cards is None or not held_cards.live(now):
            continue
        if not budget.take(agents, held_cards.envelope, MAX_PUSH_AGENTS):
            cards_left = True
            break
    attestations: list[Envelope] = []
    limit = min(req.max_attestations, config.batch_attestations, MAX_PUSH_ATTESTATIONS)
    more = False
    done: set[int] = set()
    for bh in req.buckets:
        if bh.bucket in done:
            continue
        done.add(bh.bucket)
        have = {bh.have[i : i + PREFIX_LEN] for i in range(0, len(bh.have), PREFIX_LEN)}
        for h in state.bucket(bh.bucket):
            if h[:PREFIX_LEN] in have:
                continue
            att = state.attestations[h]
            if att.attestation.expires_at_ms <= now:
                continue
            if not budget.take(attestations, att.envelope, limit):
                more = True
                break
        if more:
            break
    return LedgerPush(
        records=tuple(records),
        attestations=tuple(attestations),
        reply=True,
        more=more or cards_left,
        agents=tuple(agents),
    )
