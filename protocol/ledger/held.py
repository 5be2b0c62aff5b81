"""What a ledger state holds, made by pure constructors: held attestations, expiry-heap
entries, observer quota slots, digest lines and bucket hashes.

Each is a value of its arguments alone, never mutated, so a driver may share one result among
the many states it holds (a ``protocol.machine.Memo`` handed to ``LedgerState``: the
simulator's thousands of virtual nodes), as it shares the envelope checks.
protocol/ledger/state.py holds them and says when each is made.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

from crypto.envelope import Envelope
from crypto.hashing import digest
from protocol.ledger.messages import BUCKETS, PREFIX_LEN, RecordVersion
from protocol.ledger.records import Attestation

EMPTY_BUCKET = bytes(PREFIX_LEN)
#: every bucket's hash when none holds anything (one object for every state that starts)
EMPTY_SUMMARY = EMPTY_BUCKET * BUCKETS
#: where bucket b starts in the sorted hashes
BUCKET_START = tuple(bytes([b]) for b in range(BUCKETS))
BUCKET_PERSON = b"symphony-bucket"


class HeldAttestation(NamedTuple):
    """One held attestation (a named tuple: a simulator holds millions, made per delivery)."""

    envelope: Envelope
    attestation: Attestation
    observer: str
    hash: bytes


def held_attestation(
    envelope: Envelope, att: Attestation, observer: str, h: bytes
) -> HeldAttestation:
    """``HeldAttestation(...)`` without the named tuple's Python-level ``__new__`` (twice as
    slow, and this runs once per delivered attestation)."""
    return tuple.__new__(HeldAttestation, (envelope, att, observer, h))


def attestation_expiry(at_ms: int, h: bytes) -> tuple[int, bytes]:
    """An entry of the attestations' expiry heap."""
    return (at_ms, h)


def record_expiry(at_ms: int, peer: str, h: bytes) -> tuple[int, str, bytes]:
    """An entry of the records' expiry heap."""
    return (at_ms, peer, h)


def quota_key(observer: str, minute: int) -> tuple[str, int]:
    """An observer quota slot's key: the observer and the minute of ``observed_at``."""
    return (observer, minute)


def quota_slot_with(slot: bytes | tuple[bytes, ...], h: bytes) -> tuple[bytes, ...]:
    """A quota slot's sorted hashes with ``h`` put in place (``slot``: one hash alone, or
    several sorted). A tuple, not a list: one per slot of every node, so a memo may share
    equal ones among the nodes, as it shares the hashes."""
    if isinstance(slot, bytes):
        return (slot, h) if slot < h else (h, slot)
    i = bisect.bisect(slot, h)
    return (*slot[:i], h, *slot[i:])


def record_version(peer_id: str, seq: int, h: bytes) -> RecordVersion:
    """A held record's line in a digest (pure: a simulator's nodes that hold the same record
    share one)."""
    return RecordVersion(peer_id=peer_id, seq=seq, hash_prefix=h[:PREFIX_LEN])


def bucket_digest(members: bytes) -> bytes:
    """The hash of one bucket of attestation hashes (their concatenation, sorted)."""
    return digest(members, person=BUCKET_PERSON)[:PREFIX_LEN]


def bucket_summary_of(hashes: tuple[bytes, ...]) -> bytes:
    """Every bucket's hash, in bucket order, of the sorted attestation hashes ``hashes``.
    Pure: states that hold the same attestations get the same summary (a driver may share
    it through a ``protocol.machine.Memo``, as the simulator's nodes converge on one set)."""
    buf = bytearray(EMPTY_BUCKET * BUCKETS)
    lo, n = 0, len(hashes)
    while lo < n:
        b = hashes[lo][0]
        hi = n if b + 1 == BUCKETS else bisect.bisect_left(hashes, BUCKET_START[b + 1], lo)
        buf[b * PREFIX_LEN : (b + 1) * PREFIX_LEN] = bucket_digest(b"".join(hashes[lo:hi]))
        lo = hi
    return bytes(buf)
