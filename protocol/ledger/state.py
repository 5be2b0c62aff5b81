"""The ledger's replicated state: a CRDT of capability records and attestations.

Merge rules (each commutative, associative and idempotent, so the same records applied in any
order, with duplicates, give the same state):

* **Records**: per peer, keep the record with the greatest ``(seq, content_hash)``. A lower
  one is a ``SEQ_REPLAY``; an equal seq with a smaller hash (the subject signed two records
  with one seq) loses deterministically and is counted as a replay too. An expired record
  stops counting (it leaves the digest and queries) but is kept as a tombstone until
  ``expires_at + tombstone_ms``, so an older record cannot be replayed while it is still valid.
* **Attestations**: a grow-only set keyed by envelope content hash, minus expired members.
  Per observer and minute of ``observed_at`` at most ``observer_quota`` are kept: the ones with
  the smallest hashes (a deterministic choice), so a flood from one identity is bounded the
  same way on every node whatever order it arrives in.

The summary (``bucket_summary``) groups attestation hashes by their first byte and hashes each
bucket's sorted members, so two nodes find what differs by comparing 256 short hashes.
Agent-card records (one per node) merge like capability records; they live in ``cards``
(protocol/ledger/cards.py) and are part of the digest.

Validation of signatures and fields happens before (protocol/ledger/records.py); this module
only sees checked records and never raises for anything but ``Rejected``.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, Sequence
from itertools import islice

from crypto.envelope import Envelope
from protocol.ledger.cards import CardRecords, Held
from protocol.ledger.expiry import pop_due
from protocol.ledger.held import (
    BUCKET_START,
    EMPTY_BUCKET,
    EMPTY_SUMMARY,
    HeldAttestation,
    attestation_expiry,
    bucket_digest,
    bucket_summary_of,
    held_attestation,
    quota_key,
    quota_slot_with,
    record_expiry,
    record_version,
)
from protocol.ledger.messages import (
    BUCKETS,
    MAX_DIGEST_RECORDS,
    PREFIX_LEN,
    LedgerDigest,
    RecordVersion,
)
from protocol.ledger.records import (
    MAX_RECORD_TTL_MS,
    Attestation,
    CapabilityRecord,
    Rejected,
    Rejection,
)
from protocol.machine import Memo, no_memo

MINUTE_MS = 60 * 1000
#: hashes put in place one by one, up to this many at once; more are sorted in together
_INSORT_MAX = 16
#: this many buckets changed: the summary is made anew in one call a memo may share
_RESUMMARIZE_STALE = 16
_NEVER = 1 << 62
_EMPTY_DIGEST = LedgerDigest(records=(), attestation_count=0, attestation_buckets=b"", reply=False)


HeldRecord = Held[CapabilityRecord]


class LedgerState:
    # one per simulated node: no per-instance dict; what every delivery reads comes first
    __slots__ = ("attestations", "_quota_key", "_quota", "observer_quota", "max_attestations",
                 "_held_attestation", "_quota_slot_with", "_digest", "_soonest", "_cards_expiry",
                 "records", "max_records", "_record_expiry", "_record_expiry_entry", "_versions",
                 "tombstone_ms", "_attestation_expiry", "_bucket_digest", "_bucket_summary_of",
                 "_by_subject", "_changes", "_digest_cards", "_expiry", "_heaped", "_record_version",
                 "_sorted", "_stale_buckets", "_subject_version", "_summary", "_bucket_hashes",
                 "_bucketed", "_indexed", "cards")

    def __init__(
        self,
        *,
        observer_quota: int = 240,
        max_records: int = 10_000,
        max_attestations: int = 200_000,
        tombstone_ms: int = MAX_RECORD_TTL_MS,
        memo: Memo = no_memo,
    ) -> None:
        self.observer_quota = observer_quota
        self.max_records = max_records
        self.max_attestations = max_attestations
        self.tombstone_ms = tombstone_ms
        self.records: dict[str, HeldRecord] = {}
        #: every node's newest agent-card record
        self.cards = CardRecords(max_records=max_records, tombstone_ms=tombstone_ms)
        self._cards_expiry = self.cards.expiry  # (next_expiry reads one object, not two)
        self.attestations: dict[bytes, HeldAttestation] = {}
        self._by_subject: dict[str, set[bytes]] = {}
        self._subject_version: dict[str, int] = {}
        self._changes = 0
        # ``attestations`` keeps merge order, and ``_remove_attestation`` brings the three lazy
        # views (index, buckets, expiry heap) up to date before anything leaves: so what each
        # lacks is the last ones merged, and a count says how many (no list appended per merge)
        #: the first this many held are indexed by subject (the rest when the index is read or
        #: one leaves, numbered as if done at once; most simulated nodes never pay for it)
        self._indexed = 0
        #: every attestation hash held, sorted: bucket b is the run whose first byte is b (one
        #: list, not one per bucket: a simulator keeps this for each of thousands of nodes)
        self._sorted: list[bytes] = []
        self._bucketed = 0  # the first this many held are in ``_sorted`` (the rest when read)
        self._summary: bytes | None = b""  # cached bucket_summary(); None: recompute
        #: every bucket's hash bar ``_stale_buckets`` (bytes: a memo's may serve many states)
        self._bucket_hashes = EMPTY_SUMMARY
        self._stale_buckets: set[int] = set()
        #: cached digest(): (computed at, valid before, digest); None after any change
        self._digest: tuple[int, int, LedgerDigest] | None = None
        self._digest_cards = 0  # the ``cards.version`` the cached digest was made at
        #: its record part alike, kept across attestation changes (records change seldom)
        self._versions: tuple[int, int, tuple[RecordVersion, ...]] | None = None
        #: (observer, minute) -> its hashes held, sorted: one alone as is, several in a tuple
        #: (most observers attest once a minute, and a simulator holds this per node)
        self._quota: dict[tuple[str, int], bytes | tuple[bytes, ...]] = {}
        self._expiry: list[tuple[int, bytes]] = []  # heap of (expires_at, hash), lazy
        self._heaped = 0  # the first this many held are in ``_expiry`` (the rest when popped)
        self._record_expiry: list[tuple[int, str, bytes]] = []  # heap, lazy
        #: the sooner of the two heaps' first entries (None: none), read by ``next_expiry``
        self._soonest: int | None = None
        # the pure constructors above, through the driver's memo
        self._held_attestation = memo(held_attestation)
        self._attestation_expiry = memo(attestation_expiry)
        self._record_expiry_entry = memo(record_expiry)
        self._bucket_digest = memo(bucket_digest)
        self._bucket_summary_of = memo(bucket_summary_of)
        self._record_version = memo(record_version)
        self._quota_key = memo(quota_key)
        self._quota_slot_with = memo(quota_slot_with)

    # ------------------------------------------------------------ merge

    def merge_record(
        self, envelope: Envelope, record: CapabilityRecord, h: bytes, now_ms: int
    ) -> bool:
        """True if the record is new; False for a duplicate; ``Rejected`` if it loses."""
        current = self.records.get(record.peer_id)
        if current is not None:
            if current.hash == h:
                return False
            if (record.seq, h) < (current.record.seq, current.hash):
                raise Rejected(
                    Rejection.SEQ_REPLAY, f"seq {record.seq} <= held {current.record.seq}"
                )
        elif len(self.records) >= self.max_records:
            raise Rejected(Rejection.LEDGER_FULL, f"{len(self.records)} records held")
        # Held(...) without the named tuple's Python-level __new__ (twice as slow)
        self.records[record.peer_id] = tuple.__new__(Held, (envelope, record, h, now_ms))
        self._digest = self._versions = None
        forget_at = record.expires_at_ms + self.tombstone_ms
        heapq.heappush(self._record_expiry, self._record_expiry_entry(forget_at, record.peer_id, h))
        if self._soonest is None or forget_at < self._soonest:
            self._soonest = forget_at
        return True

    def merge_attestation(
        self, envelope: Envelope, att: Attestation, observer: str, h: bytes
    ) -> tuple[bool, tuple[bytes, ...]]:
        """(new?, hashes evicted by the observer quota), or ``Rejected``."""
        attestations = self.attestations
        if h in attestations:
            return False, ()
        key = self._quota_key(observer, att.observed_at_ms // MINUTE_MS)
        quota = self._quota
        slot = quota.get(key)
        evicted: tuple[bytes, ...] = ()
        if slot is not None and (
            1 if isinstance(slot, bytes) else len(slot)
        ) >= self.observer_quota:
            last = slot if isinstance(slot, bytes) else slot[-1]
            if h > last:
                raise Rejected(Rejection.OBSERVER_QUOTA, f"{observer} over its quota")
            evicted = (last,)
            self._remove_attestation(last)
            slot = quota.get(key)
        elif len(attestations) >= self.max_attestations:
            raise Rejected(Rejection.LEDGER_FULL, f"{len(attestations)} attestations held")
        attestations[h] = self._held_attestation(envelope, att, observer, h)
        quota[key] = h if slot is None else self._quota_slot_with(slot, h)
        self._digest = None
        if self._soonest is None or att.expires_at_ms < self._soonest:
            self._soonest = att.expires_at_ms
        return True, evicted

    # ------------------------------------------------------------ by subject

    @property
    def by_subject(self) -> dict[str, set[bytes]]:
        """Subject -> the hashes of the attestations about it (do not mutate)."""
        if self._indexed < len(self.attestations):
            self._index_subjects()
        return self._by_subject

    @property
    def subject_version(self) -> dict[str, int]:
        """A fresh number whenever a subject's attestations change (reputation caches key on
        it); never reused, absent for a subject with no attestations (do not mutate)."""
        if self._indexed < len(self.attestations):
            self._index_subjects()
        return self._subject_version

    def _index_subjects(self) -> None:
        """Index the attestations merged since last time, in the order they were merged."""
        by_subject = self._by_subject
        for held in self._merged_after(self._indexed):
            subject = held.attestation.subject
            hashes = by_subject.get(subject)
            if hashes is None:
                by_subject[subject] = {held.hash}
            else:
                hashes.add(held.hash)
            self._touch(subject)
        self._indexed = len(self.attestations)

    def _push_expiries(self) -> None:
        """Push the expiry entries of the attestations merged since last time."""
        expiry, entry = self._expiry, self._attestation_expiry
        for held in self._merged_after(self._heaped):
            heapq.heappush(expiry, entry(held.attestation.expires_at_ms, held.hash))
        self._heaped = len(self.attestations)

    def _merged_after(self, count: int) -> list[HeldAttestation]:
        """The attestations held past the first ``count``, in the order they were merged."""
        later = list(islice(reversed(self.attestations.values()), len(self.attestations) - count))
        later.reverse()
        return later

    def _put_in_buckets(self) -> None:
        """Sort the hashes merged since last time into their buckets."""
        pending = [held.hash for held in self._merged_after(self._bucketed)]
        hashes = self._sorted
        if len(pending) > _INSORT_MAX:  # many at once (a restore, a sync reply): one sort
            hashes.extend(pending)
            hashes.sort()
        else:
            for h in pending:
                bisect.insort(hashes, h)
        self._stale_buckets.update(h[0] for h in pending)
        self._bucketed = len(self.attestations)
        self._summary = None

    def _bucket_range(self, b: int) -> tuple[int, int]:
        hashes = self._sorted
        lo = bisect.bisect_left(hashes, BUCKET_START[b])
        if b + 1 == BUCKETS:
            return lo, len(hashes)
        return lo, bisect.bisect_left(hashes, BUCKET_START[b + 1], lo)

    def _remove_attestation(self, h: bytes) -> HeldAttestation | None:
        if h not in self.attestations:
            return None
        # up to date first, while the later merges are still the last ones held
        if self._bucketed < len(self.attestations):
            self._put_in_buckets()
        if self._indexed < len(self.attestations):
            self._index_subjects()
        if self._heaped < len(self.attestations):
            self._push_expiries()
        held = self.attestations.pop(h)
        self._bucketed = self._indexed = self._heaped = len(self.attestations)
        att = held.attestation
        key = (held.observer, att.observed_at_ms // MINUTE_MS)
        slot = self._quota[key]
        if isinstance(slot, bytes):
            del self._quota[key]
        else:  # several: the rest (one alone as is)
            i = bisect.bisect_left(slot, h)
            rest = slot[:i] + slot[i + 1 :]
            self._quota[key] = rest[0] if len(rest) == 1 else rest
        del self._sorted[bisect.bisect_left(self._sorted, h)]
        self._stale_buckets.add(h[0])
        self._summary = None
        self._digest = None
        subject = self._by_subject[att.subject]
        subject.discard(h)
        self._touch(att.subject)
        if not subject:
            del self._by_subject[att.subject]
            del self._subject_version[att.subject]
        return held

    def _touch(self, subject: str) -> None:
        self._changes += 1
        self._subject_version[subject] = self._changes

    # ------------------------------------------------------------ expiry

    def prune(self, now_ms: int) -> tuple[list[str], list[HeldAttestation]]:
        """Drop expired attestations and records past their tombstone time."""
        gone: list[HeldAttestation] = []
        if self._heaped < len(self.attestations):
            self._push_expiries()
        for _, h in pop_due(self._expiry, now_ms):
            held = self._remove_attestation(h)
            if held is not None:
                gone.append(held)
        peers: list[str] = []
        for _, peer, h in pop_due(self._record_expiry, now_ms):
            current = self.records.get(peer)
            if current is not None and current.hash == h:
                del self.records[peer]
                self._digest = self._versions = None
                peers.append(peer)
        heaps = (self._expiry, self._record_expiry)
        self._soonest = min((heap[0][0] for heap in heaps if heap), default=None)
        return peers, gone

    def next_expiry(self) -> int | None:
        """When ``prune`` or ``cards.prune`` next has something to do (may be early: the
        heaps are lazy)."""
        # asked after every delivery: compared in line, no list and no min()
        t, cards = self._soonest, self._cards_expiry
        if cards and (t is None or cards[0][0] < t):
            t = cards[0][0]
        return t

    # ------------------------------------------------------------ summary

    def live_records(self, now_ms: int) -> Iterator[HeldRecord]:
        for peer in sorted(self.records):
            held = self.records[peer]
            if held.live(now_ms):
                yield held

    def bucket_summary(self) -> bytes:
        if self._bucketed < len(self.attestations):
            self._put_in_buckets()
        summary = self._summary
        if summary is None and len(self._stale_buckets) >= _RESUMMARIZE_STALE:
            full = self._bucket_hashes = self._bucket_summary_of(tuple(self._sorted))
            self._stale_buckets.clear()
            summary = self._summary = full if self.attestations else b""
        elif summary is None:
            buf = bytearray(self._bucket_hashes)
            hashes = self._sorted
            for b in self._stale_buckets:
                lo, hi = self._bucket_range(b)
                buf[b * PREFIX_LEN : (b + 1) * PREFIX_LEN] = (
                    self._bucket_digest(b"".join(hashes[lo:hi])) if hi > lo else EMPTY_BUCKET
                )
            self._stale_buckets.clear()
            self._bucket_hashes = bytes(buf)
            summary = self._summary = self._bucket_hashes if self.attestations else b""
        return summary

    def bucket(self, b: int) -> Sequence[bytes]:
        """The sorted hashes in bucket ``b`` (do not mutate)."""
        if self._bucketed < len(self.attestations):
            self._put_in_buckets()
        lo, hi = self._bucket_range(b)
        return self._sorted[lo:hi]

    def digest(self, now_ms: int) -> LedgerDigest:
        """What we hold, as a ``LedgerDigest`` with ``reply`` false (the same object until
        something changes or a record in it expires)."""
        cached = self._digest
        cards = self.cards
        if (
            cached is not None
            and cached[0] <= now_ms < cached[1]
            and self._digest_cards == cards.version
        ):
            return cached[2]
        if not self.records and not self.attestations and not cards.held:
            return _EMPTY_DIGEST  # one object for every empty ledger
        versions = self._versions
        if versions is None or not versions[0] <= now_ms < versions[1]:
            live = [h for _, h in sorted(self.records.items()) if h.live(now_ms)]  # by peer
            versions = self._versions = (
                now_ms,
                min((h.record.expires_at_ms for h in live), default=_NEVER),
                tuple(self._record_version(h.record.peer_id, h.record.seq, h.hash) for h in live),
            )
        agents, agents_valid_before = cards.versions(now_ms)
        d = LedgerDigest(
            records=versions[2][:MAX_DIGEST_RECORDS],
            attestation_count=len(self.attestations),
            attestation_buckets=self.bucket_summary(),
            reply=False,
            agents=agents,
        )
        valid_before = min(versions[1], agents_valid_before)
        self._digest = (now_ms, valid_before, d)
        self._digest_cards = cards.version
        return d
