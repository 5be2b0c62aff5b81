"""Rendezvous discovery on the wire: signed peer records, registrations and queries.

Contract
--------
* A ``PeerRecord`` is what a node says about itself: its network id, its peer id, the addresses
  it can be dialled at (each ending in ``/p2p/<its peer id>``), when it signed them (Unix epoch
  ms) and for how long they hold. It travels only inside an ``Envelope`` of domain
  ``PEER_RECORD_DOMAIN``; :func:`open_peer_record` is the one check of such an envelope: it
  opens only if its signer is the record's peer, the network id is ours and it is live at our
  clock (``max_skew_ms`` of tolerance both ways). Anyone may relay a record: its signature,
  not the relayer, vouches for it, so a record learnt from one peer can be served to others.
* ``Register`` hands a peer our own record to keep and serve (the sender must be its signer).
  ``DiscoverRequest`` asks a peer for the records it keeps that are newer than ``cookie``
  (the cookie of that peer's last answer, 0 at first); ``DiscoverResponse`` carries at most
  ``limit`` of them and the cookie to ask with next time, so a node that asks again learns
  only what changed: the peers that joined or re-registered since.

Tags 7-10 of the core range (protocol/membership/messages.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from crypto.envelope import Envelope
from protocol.codec import Message, limits, message
from protocol.envelopes import PENALTY_FORGED, open_envelope
from protocol.errors import InvalidMessage
from protocol.membership.messages import MAX_ADDR_LEN, MAX_ADDRS, MAX_PEER_ID_LEN
from protocol.names import peer_id_of_multiaddr

PEER_RECORD_DOMAIN = "symphony/membership/peer-record/v1"
#: the signed payload of one record: 8 addresses of 256 characters fit with room to spare
MAX_RECORD_BYTES = 4096
#: the longest a record may claim to hold
MAX_RECORD_TTL_MS = 24 * 3600 * 1000
#: records per DiscoverResponse (and the largest ``limit`` a request may ask for)
MAX_DISCOVER_RECORDS = 32
#: Unix epoch ms up to the year 2255: beyond is no clock of an honest node
MAX_EPOCH_MS = 1 << 43

#: penalty points for each way a relayed or registered record is refused (one per message)
RECORD_PENALTIES = {"invalid": PENALTY_FORGED, "forged": PENALTY_FORGED,
                    "foreign": PENALTY_FORGED, "expired": 2, "future": 2}


@message(7)
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerRecord(Message):
    """A node's signed statement of where it can be dialled (inside an Envelope only)."""

    network_id: str = limits(max_len=32)
    peer_id: str = limits(max_len=MAX_PEER_ID_LEN)
    addrs: tuple[str, ...] = limits(max_items=MAX_ADDRS, max_len=MAX_ADDR_LEN)
    issued_at_ms: int = limits(lo=0, hi=MAX_EPOCH_MS)
    ttl_ms: int = limits(lo=1, hi=MAX_RECORD_TTL_MS)

    def check(self) -> None:
        if not self.addrs:
            raise ValueError("a peer record names at least one address")
        for addr in self.addrs:
            if peer_id_of_multiaddr(addr) != self.peer_id:
                raise ValueError(f"address {addr!r} is not one of peer {self.peer_id!r}")

    @property
    def expires_at_ms(self) -> int:
        return self.issued_at_ms + self.ttl_ms


@message(8)
@dataclass(frozen=True, slots=True, kw_only=True)
class Register(Message):
    """Keep my record and serve it to peers that ask (signed by the sender: never a replay
    of the same bytes, each registration is signed afresh)."""

    record: Envelope


@message(9)
@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoverRequest(Message):
    """Which peers of our network do you know, newer than ``cookie``? (the same bytes again
    when nothing changed: repeatable)"""
    repeatable: ClassVar[bool] = True

    limit: int = limits(lo=1, hi=MAX_DISCOVER_RECORDS)
    cookie: int = limits(lo=0, hi=(1 << 63) - 1)


@message(10)
@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoverResponse(Message):
    """Signed records of other peers, oldest change first, and the cookie to ask with next."""

    records: tuple[Envelope, ...] = limits(max_items=MAX_DISCOVER_RECORDS)
    cookie: int = limits(lo=0, hi=(1 << 63) - 1)


class RecordRefused(Exception):
    """A peer record does not open: ``why`` is a key of ``RECORD_PENALTIES``."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why
        self.detail = detail


def open_peer_record(
    envelope: Envelope, *, network_id: str, now_epoch_ms: int, max_skew_ms: int
) -> PeerRecord:
    """The record in ``envelope`` if its peer signed it, it is of ``network_id`` and it is
    live at ``now_epoch_ms`` give or take ``max_skew_ms``; else ``RecordRefused``."""
    if len(envelope.payload) > MAX_RECORD_BYTES:  # refused before a signature is checked
        raise RecordRefused("invalid", f"record of {len(envelope.payload)} bytes exceeds "
                                       f"{MAX_RECORD_BYTES}")
    try:
        record = open_envelope(envelope, PEER_RECORD_DOMAIN, PeerRecord, MAX_RECORD_BYTES)
    except InvalidMessage as exc:
        raise RecordRefused("invalid", str(exc)) from None
    if envelope.signer != record.peer_id:
        raise RecordRefused("forged", f"record of {record.peer_id} signed by {envelope.signer}")
    if record.network_id != network_id:
        raise RecordRefused("foreign", f"record of network {record.network_id!r}, "
                                       f"not ours ({network_id!r})")
    if record.issued_at_ms > now_epoch_ms + max_skew_ms:
        raise RecordRefused("future", f"record of {record.peer_id} signed "
                                      f"{record.issued_at_ms - now_epoch_ms} ms ahead of us")
    if record.expires_at_ms + max_skew_ms <= now_epoch_ms:
        raise RecordRefused("expired", f"record of {record.peer_id} expired "
                                       f"{now_epoch_ms - record.expires_at_ms} ms ago")
    return record
