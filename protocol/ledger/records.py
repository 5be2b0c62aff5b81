"""Ledger records: signed capability records and attestations, and the checks every received
record goes through (the wire messages that carry them are in protocol/ledger/messages.py).

Contract
--------
* A **capability record** says what one node offers (models with measured tokens/s, hardware,
  price, load, roles, addresses). It travels in an ``Envelope`` with domain
  ``CAPABILITY_DOMAIN`` and is valid only if the envelope's signer *is* the record's
  ``peer_id`` (nobody advertises for someone else), the network id is ours, its lifetime is at
  most ``max_ttl_ms`` and it has not expired.
* An **attestation** is one observer's signed statement about a subject peer (a task completed,
  failed or timed out; a verification passed or failed, with the evidence hash; relay chunks
  served). It travels in an ``Envelope`` with domain ``ATTESTATION_DOMAIN``; the signer is the
  observer and may not be the subject. Identity is the envelope's content hash.
* ``open_capability`` / ``open_attestation`` check an envelope *as received*: size first, then
  domain (an unknown ``.../vN`` domain is an unknown version), then the signature over the
  received payload bytes, then the payload's tag and version, then its fields and times. Any
  failure raises ``Rejected`` carrying one ``Rejection`` reason; nothing else escapes.
* State-dependent checks (sequence replay, per-observer quota, rate limits) live in
  protocol/ledger/state.py and protocol/ledger/machine.py; they raise the same ``Rejected``.

Tags 20-39 belong to the ledger. All times are Unix epoch milliseconds.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from crypto.envelope import Envelope, EnvelopeError
from protocol.codec import M, Message, decode, limits, message, peek_tag_version
from protocol.errors import InvalidMessage

CAPABILITY_DOMAIN = "symphony/ledger/capability/v1"
ATTESTATION_DOMAIN = "symphony/ledger/attestation/v1"
_CAPABILITY_FAMILY = "symphony/ledger/capability/"
_ATTESTATION_FAMILY = "symphony/ledger/attestation/"

#: signed payload limits; a larger envelope is rejected as oversized before any other check.
MAX_RECORD_BYTES = 8 * 1024
MAX_ATTESTATION_BYTES = 1024
MAX_MODELS = 16
MAX_TAGS = 16
MAX_ADDRS = 8
MAX_PEER_ID_LEN = 64
MAX_OBJECT_ID_LEN = 64
HASH_LEN = 32
#: a capability record lives at most this long after it was issued.
MAX_RECORD_TTL_MS = 60 * 60 * 1000
#: an attestation lives at most this long after it was observed.
MAX_ATTESTATION_TTL_MS = 30 * 24 * 60 * 60 * 1000
#: how far ahead of our clock a peer's clock may run.
MAX_CLOCK_SKEW_MS = 60 * 1000


class Role(enum.Enum):
    EXECUTOR = "executor"
    VERIFIER = "verifier"
    RELAY = "relay"
    LEARNER = "learner"


class AttestationKind(enum.Enum):
    TASK_COMPLETED = "task_completed"
    TASK_FAILED = "task_failed"
    TASK_TIMED_OUT = "task_timed_out"
    VERIFICATION_PASSED = "verification_passed"
    #: requires ``evidence_hash``
    VERIFICATION_FAILED = "verification_failed"
    #: ``amount`` is the number of chunks served
    RELAY_SERVED = "relay_served"
    #: a verifier's verdict was overturned by an escalation panel; requires ``evidence_hash``
    VERDICT_CONTRADICTED = "verdict_contradicted"
    #: a relay sent bytes that do not match the signed manifest; requires ``evidence_hash``
    #: (the hash of the bytes received); ``amount`` is the chunk index
    RELAY_BAD_CHUNK = "relay_bad_chunk"
    #: a relay parent was asked for chunks of the version and sent none (a free rider)
    RELAY_WITHHELD = "relay_withheld"


_NEEDS_EVIDENCE = frozenset({AttestationKind.VERIFICATION_FAILED,
                             AttestationKind.VERDICT_CONTRADICTED, AttestationKind.RELAY_BAD_CHUNK})


class Rejection(enum.Enum):
    """Why a received record, attestation or message was refused (counted per peer)."""

    BAD_SIGNATURE = "bad_signature"
    SIGNER_NOT_SUBJECT = "signer_not_subject"
    WRONG_NETWORK = "wrong_network"
    SEQ_REPLAY = "seq_replay"
    EXPIRY_TOO_FAR = "expiry_too_far"
    OVERSIZED = "oversized"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_VERSION = "unknown_version"
    MALFORMED = "malformed"
    WRONG_DOMAIN = "wrong_domain"
    FROM_FUTURE = "from_future"
    EXPIRED = "expired"
    SELF_ATTESTATION = "self_attestation"
    OBSERVER_QUOTA = "observer_quota"
    LEDGER_FULL = "ledger_full"
    UNSOLICITED = "unsolicited"
    #: an agent card's vector is not its own description's (the receiver re-embedded the
    #: description with the same embedder: protocol.agents.matching.vector_agrees)
    VECTOR_MISMATCH = "vector_mismatch"


#: penalty points per rejection; 0 means "counted, not the sender's fault".
PENALTY_POINTS: dict[Rejection, int] = {
    Rejection.BAD_SIGNATURE: 20,
    Rejection.SIGNER_NOT_SUBJECT: 20,
    Rejection.WRONG_NETWORK: 10,
    Rejection.SEQ_REPLAY: 2,
    Rejection.EXPIRY_TOO_FAR: 10,
    Rejection.OVERSIZED: 20,
    Rejection.RATE_LIMITED: 5,
    Rejection.UNKNOWN_VERSION: 1,
    Rejection.MALFORMED: 20,
    Rejection.WRONG_DOMAIN: 20,
    Rejection.FROM_FUTURE: 5,
    Rejection.EXPIRED: 0,
    Rejection.SELF_ATTESTATION: 10,
    Rejection.OBSERVER_QUOTA: 0,
    Rejection.LEDGER_FULL: 0,
    Rejection.UNSOLICITED: 5,
    Rejection.VECTOR_MISMATCH: 20,
}


class Rejected(Exception):
    """A record or message is refused for ``reason``."""

    def __init__(self, reason: Rejection, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


# ---------------------------------------------------------------- signed payloads


@message(20)
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelOffer(Message):
    name: str = limits(max_len=128)
    family: str = limits(max_len=64)
    quantization: str = limits(max_len=32)
    context_length: int = limits(lo=0, hi=1 << 24)
    #: content hash of the weights file
    weights_hash: bytes = limits(size=HASH_LEN)
    #: measured by the self-benchmark at start-up, not configured
    tokens_per_s: float = limits(lo=0.0, hi=1e7)


@message(21)
@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSummary(Message):
    device_kind: str = limits(max_len=16)
    device_name: str = limits(max_len=128)
    memory_bytes: int = limits(lo=0, hi=1 << 50)
    cpu_cores: int = limits(lo=0, hi=1 << 16)


#: most upload bandwidth a capability record may claim, bytes/s (about 8.8 Tbit/s)
MAX_UPLOAD_BPS = 1 << 40
#: block ranges one record may offer (one per model, a few models at most)
MAX_BLOCK_OFFERS = 8


@message(29)
@dataclass(frozen=True, slots=True, kw_only=True)
class BlockOffer(Message):
    """A contiguous range of a model's transformer blocks this node serves to inference
    sessions (layer-sharded serving), with what it costs and what it has free."""

    model: str = limits(max_len=128)
    start: int = limits(lo=0, hi=4096)
    end: int = limits(lo=1, hi=4096)
    #: the model's block count, so a requester knows what a full chain covers
    n_blocks: int = limits(lo=1, hi=4096)
    #: measured milliseconds per block per token (one position through one block)
    ms_per_block: float = limits(lo=0.0, hi=1e6)
    free_sessions: int = limits(lo=0, hi=1 << 16)
    max_sessions: int = limits(lo=0, hi=1 << 16)
    #: attention-cache bytes still free for new sessions
    free_cache_bytes: int = limits(lo=0, hi=1 << 50)

    def check(self) -> None:
        if not self.start < self.end <= self.n_blocks:
            raise ValueError(f"block range [{self.start}, {self.end}) of {self.n_blocks}")
        if self.free_sessions > self.max_sessions:
            raise ValueError("free_sessions exceeds max_sessions")


@message(22)
@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityRecord(Message):
    network_id: str = limits(max_len=32)
    peer_id: str = limits(max_len=MAX_PEER_ID_LEN)
    seq: int = limits(lo=0)
    issued_at_ms: int = limits(lo=0)
    expires_at_ms: int = limits(lo=0)
    listen_addrs: tuple[str, ...] = limits(max_items=MAX_ADDRS, max_len=256)
    models: tuple[ModelOffer, ...] = limits(max_items=MAX_MODELS)
    hardware: HardwareSummary
    price_per_1k_tokens: float = limits(lo=0.0, hi=1e9)
    free_slots: int = limits(lo=0, hi=1 << 16)
    max_slots: int = limits(lo=0, hi=1 << 16)
    #: fraction of capacity in use, 0..1
    load: float = limits(lo=0.0, hi=1.0)
    roles: tuple[Role, ...] = limits(max_items=len(Role))
    tags: tuple[str, ...] = limits(max_items=MAX_TAGS, max_len=64)
    software_version: str = limits(max_len=64)
    #: block ranges served to inference sessions; absent from records of older versions
    blocks: tuple[BlockOffer, ...] = limits(max_items=MAX_BLOCK_OFFERS, default=())
    #: upload bandwidth, bytes/s, the node measured on its relay streams or was configured
    #: with (0: unknown); the relay plan sizes the node's fan-out from it. Absent from records
    #: of older versions
    upload_bps: int = limits(lo=0, hi=MAX_UPLOAD_BPS, default=0)

    def check(self) -> None:
        if self.expires_at_ms <= self.issued_at_ms:
            raise ValueError("a record must expire after it was issued")
        if self.free_slots > self.max_slots:
            raise ValueError("free_slots exceeds max_slots")
        if len(set(self.roles)) != len(self.roles):
            raise ValueError("roles repeat")
        if len({m.name for m in self.models}) != len(self.models):
            raise ValueError("model names repeat")

    def offer(self, model: str) -> ModelOffer | None:
        for m in self.models:
            if m.name == model:
                return m
        return None


@message(23)
@dataclass(frozen=True, slots=True, kw_only=True)
class Attestation(Message):
    network_id: str = limits(max_len=32)
    subject: str = limits(max_len=MAX_PEER_ID_LEN)
    #: the task or object the statement is about
    object_id: bytes = limits(max_len=MAX_OBJECT_ID_LEN)
    kind: AttestationKind
    #: short human-readable outcome ("answer matched the vote", "timeout after 30 s")
    outcome: str = limits(max_len=128)
    #: hash of the evidence (empty, or 32 bytes; required for failed verifications)
    evidence_hash: bytes = limits(max_len=HASH_LEN)
    #: a count where the kind has one (chunks served), else 0
    amount: int = limits(lo=0, hi=1 << 32)
    observed_at_ms: int = limits(lo=0)
    expires_at_ms: int = limits(lo=0)

    def check(self) -> None:
        if len(self.evidence_hash) not in (0, HASH_LEN):
            raise ValueError("evidence_hash must be empty or 32 bytes")
        if self.kind in _NEEDS_EVIDENCE and not self.evidence_hash:
            raise ValueError(f"a {self.kind.value} attestation needs an evidence hash")
        if self.expires_at_ms <= self.observed_at_ms:
            raise ValueError("an attestation must expire after it was observed")


# ---------------------------------------------------------------- checks


def envelope_hash(envelope: Envelope) -> bytes:
    """The envelope's content hash. Pure: a function of its bytes (a driver may share it
    through a ``protocol.machine.Memo``)."""
    return envelope.content_hash


def open_signed(envelope: Envelope, domain: str, family: str, max_bytes: int,
                expect: type[M]) -> M:
    """The ``expect`` in ``envelope`` after the size, domain, signature, version and decoding
    checks, or ``Rejected``: a pure function of the envelope's bytes. ``family`` is the
    domain without its version (a domain of the family, other version, is UNKNOWN_VERSION).
    Every signed ledger record opens through it (capabilities, attestations, agent cards);
    :func:`check_own_record` follows for the network, signer and time checks."""
    if len(envelope.payload) > max_bytes:
        raise Rejected(Rejection.OVERSIZED, f"{len(envelope.payload)} bytes > {max_bytes}")
    if envelope.domain != domain:
        if envelope.domain.startswith(family):
            raise Rejected(Rejection.UNKNOWN_VERSION, f"domain {envelope.domain!r}")
        raise Rejected(Rejection.WRONG_DOMAIN, f"domain {envelope.domain!r}")
    try:
        payload = envelope.verify(domain)
    except EnvelopeError as exc:
        raise Rejected(Rejection.BAD_SIGNATURE, str(exc)) from None
    head = peek_tag_version(payload)
    if head is not None and head[0] == expect.TAG and head[1] != expect.VERSION:
        raise Rejected(Rejection.UNKNOWN_VERSION, f"{expect.__name__} v{head[1]}")
    try:
        return decode(payload, expect, max_frame=max_bytes)
    except InvalidMessage as exc:
        raise Rejected(Rejection.MALFORMED, str(exc)) from None


def check_times(
    start_ms: int, expires_at_ms: int, now_ms: int, max_ttl_ms: int, skew_ms: int
) -> None:
    """``Rejected`` unless a record issued at ``start_ms`` and expiring at ``expires_at_ms``
    lives at most ``max_ttl_ms``, is not from more than ``skew_ms`` ahead and not expired."""
    if start_ms > now_ms + skew_ms:
        raise Rejected(Rejection.FROM_FUTURE, f"issued at {start_ms}, now {now_ms}")
    if expires_at_ms - start_ms > max_ttl_ms or expires_at_ms > now_ms + max_ttl_ms + skew_ms:
        raise Rejected(Rejection.EXPIRY_TOO_FAR, f"expires at {expires_at_ms}, now {now_ms}")
    if expires_at_ms <= now_ms:
        raise Rejected(Rejection.EXPIRED, f"expired at {expires_at_ms}, now {now_ms}")


class OwnRecord(Protocol):
    """A record a node signs about itself (a capability record, its agent cards)."""

    @property
    def network_id(self) -> str: ...
    @property
    def peer_id(self) -> str: ...
    @property
    def issued_at_ms(self) -> int: ...
    @property
    def expires_at_ms(self) -> int: ...


def check_own_record(record: OwnRecord, envelope: Envelope, network_id: str, now_ms: int,
                     signer: str | None, max_ttl_ms: int, skew_ms: int) -> None:
    """``Rejected`` unless ``record`` is of our network, signed by the peer it is about
    (``signer``: the envelope's peer id where the caller has it cached) and within its times."""
    if record.network_id != network_id:
        raise Rejected(Rejection.WRONG_NETWORK, f"network {record.network_id!r}")
    if record.peer_id != (signer if signer is not None else envelope.signer):
        raise Rejected(Rejection.SIGNER_NOT_SUBJECT,
                       f"{type(record).__name__} for {record.peer_id}")
    check_times(record.issued_at_ms, record.expires_at_ms, now_ms, max_ttl_ms, skew_ms)


def signed_capability(envelope: Envelope) -> CapabilityRecord:
    """The record in ``envelope`` after the size, domain, signature, version and decoding
    checks, or ``Rejected``. Pure: a function of the envelope's bytes alone, whose result is
    never mutated (a driver may share it through a ``protocol.machine.Memo``); the checks of
    network, signer and times follow in :func:`open_capability`."""
    return open_signed(
        envelope, CAPABILITY_DOMAIN, _CAPABILITY_FAMILY, MAX_RECORD_BYTES, CapabilityRecord
    )


def signed_attestation(envelope: Envelope) -> Attestation:
    """The attestation in ``envelope`` after the checks of :func:`signed_capability` (pure
    likewise); :func:`open_attestation` adds those of network, observer and times."""
    return open_signed(
        envelope, ATTESTATION_DOMAIN, _ATTESTATION_FAMILY, MAX_ATTESTATION_BYTES, Attestation
    )


def open_capability(
    envelope: Envelope,
    network_id: str,
    now_ms: int,
    signer: str | None = None,
    max_ttl_ms: int = MAX_RECORD_TTL_MS,
    skew_ms: int = MAX_CLOCK_SKEW_MS,
    signed: Callable[[Envelope], CapabilityRecord] = signed_capability,
) -> CapabilityRecord:
    """The checked record in ``envelope``, or ``Rejected``. ``signer`` is the envelope's peer
    id where the caller has it cached (the ledger's hot path passes every argument by position);
    ``signed`` is :func:`signed_capability` or the caller's memo of it.
    """
    record = signed(envelope)
    check_own_record(record, envelope, network_id, now_ms, signer, max_ttl_ms, skew_ms)
    return record


def open_attestation(
    envelope: Envelope,
    network_id: str,
    now_ms: int,
    signer: str | None = None,
    max_ttl_ms: int = MAX_ATTESTATION_TTL_MS,
    skew_ms: int = MAX_CLOCK_SKEW_MS,
    signed: Callable[[Envelope], Attestation] = signed_attestation,
) -> Attestation:
    """The checked attestation in ``envelope``, or ``Rejected`` (``signer`` and ``signed`` as
    above)."""
    att = signed(envelope)
    if att.network_id != network_id:
        raise Rejected(Rejection.WRONG_NETWORK, f"network {att.network_id!r}")
    if att.subject == (signer if signer is not None else envelope.signer):
        raise Rejected(Rejection.SELF_ATTESTATION, "an observer may not attest itself")
    check_times(att.observed_at_ms, att.expires_at_ms, now_ms, max_ttl_ms, skew_ms)
    return att
