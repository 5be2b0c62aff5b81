"""The ledger's wire messages (tags 24-28): digests, sync requests and pushes.

Contract
--------
* ``LedgerPush`` carries signed capability records, attestations and nodes' agent cards
  (envelopes as received; protocol/ledger/records.py and protocol/agents/cards.py check each
  one): as gossip on ``LEDGER_TOPIC`` (``reply``
  false), or as the answer to a ``LedgerSyncRequest`` (``reply`` true, ``more`` when the
  responder stopped at a batch limit).
* ``LedgerDigest`` summarizes what a node holds: live record versions and one hash prefix per
  attestation bucket, so two nodes find what differs without listing every hash; agent-card
  records are versioned per node like capability records (``agents``).
* ``LedgerSyncRequest`` pulls the named peers' records (and agent cards) and the attestations
  of the listed buckets that the requester lacks (``BucketHave``: the prefixes it holds).
* The ``agents`` fields came last, with a default: frames of nodes from before agent cards
  still decode (with no cards in them).
* Every count and length is bounded by the limits below; decoding refuses anything past them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from crypto.envelope import Envelope
from protocol.codec import Message, limits, message
from protocol.ledger.records import MAX_PEER_ID_LEN

#: short gossip topic name (the driver adds the network id: ``symphony/<net>/ledger/1``).
LEDGER_TOPIC = "ledger"

#: digest and sync limits
BUCKETS = 256
PREFIX_LEN = 8
MAX_DIGEST_RECORDS = 4096
MAX_REQUEST_RECORDS = 64
MAX_HAVE_PREFIXES = 8192
MAX_PUSH_RECORDS = 64
MAX_PUSH_ATTESTATIONS = 1024
#: agent-card records per push, and asked for per sync request: each may be up to
#: protocol.agents.cards.MAX_AGENT_CARDS_BYTES, so a full request's answer stays well within a
#: frame beside its records and attestations (the answer's byte budget bounds it too)
MAX_PUSH_AGENTS = 8
MAX_REQUEST_AGENTS = MAX_PUSH_AGENTS


@message(24)
@dataclass(frozen=True, slots=True, kw_only=True)
class RecordVersion(Message):
    peer_id: str = limits(max_len=MAX_PEER_ID_LEN)
    seq: int = limits(lo=0)
    #: first bytes of the record envelope's content hash (breaks same-seq ties)
    hash_prefix: bytes = limits(size=PREFIX_LEN)


@message(25)
@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerDigest(Message):
    """What a node holds: live record versions, and a summary of its attestation set.

    ``attestation_buckets`` is empty for an empty set, else ``BUCKETS`` hashes of
    ``PREFIX_LEN`` bytes: bucket ``b`` summarizes the attestations whose content hash starts
    with byte ``b``, so two nodes find the differing buckets without listing 10,000 hashes.
    """
    repeatable: ClassVar[bool] = True

    records: tuple[RecordVersion, ...] = limits(max_items=MAX_DIGEST_RECORDS)
    attestation_count: int = limits(lo=0)
    attestation_buckets: bytes = limits(max_len=BUCKETS * PREFIX_LEN)
    #: an answer to the peer's digest (never answered in turn, so digests cannot ping-pong)
    reply: bool
    #: live agent-card record versions, one per node (absent from frames of older versions)
    agents: tuple[RecordVersion, ...] = limits(max_items=MAX_DIGEST_RECORDS, default=())

    def check(self) -> None:
        if len(self.attestation_buckets) not in (0, BUCKETS * PREFIX_LEN):
            raise ValueError("attestation_buckets must be empty or one prefix per bucket")


@message(26)
@dataclass(frozen=True, slots=True, kw_only=True)
class BucketHave(Message):
    bucket: int = limits(lo=0, hi=BUCKETS - 1)
    #: concatenated hash prefixes the requester already holds in this bucket
    have: bytes = limits(max_len=MAX_HAVE_PREFIXES * PREFIX_LEN)

    def check(self) -> None:
        if len(self.have) % PREFIX_LEN:
            raise ValueError("have must be whole hash prefixes")


@message(27)
@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerSyncRequest(Message):
    """Pull: send me these peers' records and the attestations of these buckets I lack."""
    repeatable: ClassVar[bool] = True

    records: tuple[str, ...] = limits(max_items=MAX_REQUEST_RECORDS, max_len=MAX_PEER_ID_LEN)
    buckets: tuple[BucketHave, ...] = limits(max_items=BUCKETS)
    max_attestations: int = limits(lo=1, hi=MAX_PUSH_ATTESTATIONS)
    #: nodes whose agent-card records the requester wants (absent from older frames)
    agents: tuple[str, ...] = limits(
        max_items=MAX_REQUEST_AGENTS, max_len=MAX_PEER_ID_LEN, default=()
    )


@message(28)
@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerPush(Message):
    """Records, attestations and agent cards: gossip (``reply`` false) or the answer to a sync request."""

    records: tuple[Envelope, ...] = limits(max_items=MAX_PUSH_RECORDS)
    attestations: tuple[Envelope, ...] = limits(max_items=MAX_PUSH_ATTESTATIONS)
    reply: bool
    #: in a reply: the responder stopped at a batch limit and holds more for this request
    more: bool
    #: signed AgentCards records (protocol/agents/cards.py; absent from older frames)
    agents: tuple[Envelope, ...] = limits(max_items=MAX_PUSH_AGENTS, default=())
