"""The ledger machine's configuration, local events (commands from this node) and effects.

Re-exported by protocol/ledger/machine.py; callers import from there.

* ``SetCapability(spec)``: this node's offer changed (or is first known): sign and publish.
* ``SetLoad(free_slots, load)``: only the load changed (coalesced, see ``min_republish_ms``).
* ``Attest(...)``: sign, store and publish an attestation about another peer.
* Effects ``StoreCapability`` / ``StoreAttestation`` / ``ForgetCapabilities`` /
  ``ForgetAttestations``: the driver persists them (node/ledger/store.py); the simulator may
  ignore them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from crypto.envelope import Envelope
from protocol.ledger.records import (
    MAX_ATTESTATION_TTL_MS,
    MAX_CLOCK_SKEW_MS,
    MAX_RECORD_TTL_MS,
    Attestation,
    AttestationKind,
    BlockOffer,
    CapabilityRecord,
    HardwareSummary,
    ModelOffer,
    Role,
)


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    record_ttl_ms: int = 15 * 60 * 1000  # lifetime of our own record
    refresh_ms: int = 5 * 60 * 1000  # re-sign our record this often
    min_republish_ms: int = 2_000  # changes (load) coalesce into one record per this
    attestation_ttl_ms: int = 7 * 24 * 60 * 60 * 1000  # lifetime of our attestations
    anti_entropy_ms: int = 30_000  # periodic digest to sync_fanout random peers
    sync_fanout: int = 2
    sync_timeout_ms: int = 10_000  # per pull round
    max_concurrent_syncs: int = 1  # pulls from several peers would fetch the same items
    max_sync_rounds: int = 1_000
    batch_attestations: int = 256  # per reply
    batch_bytes: int = 512 * 1024  # per reply
    request_have_bytes: int = 64 * 1024  # hash prefixes per request
    digest_reply_min_ms: int = 5_000  # at most one digest reply per peer per this
    max_gossip_items: int = 32  # per unsolicited push
    attestation_rate_per_minute: int = 600  # unsolicited attestations per sending peer
    digest_rate_per_minute: int = 30
    request_rate_per_minute: int = 600
    observer_quota: int = 240  # attestations kept per observer per minute
    max_records: int = 10_000
    max_attestations: int = 200_000
    max_record_ttl_ms: int = MAX_RECORD_TTL_MS
    max_attestation_ttl_ms: int = MAX_ATTESTATION_TTL_MS
    clock_skew_ms: int = MAX_CLOCK_SKEW_MS


# ---------------------------------------------------------------- local events


@dataclass(frozen=True, slots=True)
class CapabilitySpec:
    """What this node offers: a capability record minus identity, seq and times."""

    listen_addrs: tuple[str, ...]
    models: tuple[ModelOffer, ...]
    hardware: HardwareSummary
    price_per_1k_tokens: float
    free_slots: int
    max_slots: int
    load: float
    roles: tuple[Role, ...]
    tags: tuple[str, ...] = ()
    software_version: str = ""
    blocks: tuple[BlockOffer, ...] = ()
    upload_bps: int = 0


@dataclass(frozen=True, slots=True)
class SetCapability:
    spec: CapabilitySpec


@dataclass(frozen=True, slots=True)
class SetLoad:
    free_slots: int
    load: float


@dataclass(frozen=True, slots=True)
class Attest:
    subject: str
    object_id: bytes
    kind: AttestationKind
    outcome: str = ""
    evidence_hash: bytes = b""
    amount: int = 0


# ---------------------------------------------------------------- effects


class StoreCapability(NamedTuple):
    """Persist ``envelope`` as ``record.peer_id``'s record, replacing any older one (a named
    tuple: made once per delivered record)."""

    envelope: Envelope
    record: CapabilityRecord


def store_capability(envelope: Envelope, record: CapabilityRecord) -> StoreCapability:
    """``StoreCapability(envelope, record)`` without the named tuple's Python-level
    ``__new__`` (twice as slow, and this runs once per delivered record)."""
    return tuple.__new__(StoreCapability, (envelope, record))


class StoreAttestation(NamedTuple):
    """Persist an attestation (a named tuple: made once per delivered attestation)."""

    envelope: Envelope
    attestation: Attestation
    hash: bytes


@dataclass(frozen=True, slots=True)
class ForgetCapabilities:
    peer_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ForgetAttestations:
    hashes: tuple[bytes, ...]
