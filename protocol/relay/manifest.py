"""The signed manifest of one artifact version, and the wire messages of the chunk streams.

Contract
--------
A publisher cuts an artifact (a weights file) into chunks of ``chunk_size`` bytes (the last one
may be shorter) and signs a :class:`ManifestBody` listing every chunk's hash, the Merkle root
over those hashes, the artifact's name, a monotonic version, its format, an optional base
version (for deltas), its own upload bandwidth and the recipients the relay plan is built for
(so every peer computes the same plan from the manifest alone, see protocol/relay/plan.py).

The body travels as ``encode(body)`` inside an :class:`~crypto.envelope.Envelope` signed in the
domain ``MANIFEST_DOMAIN``; the wire message is :class:`RelayManifest`, gossiped on the
``RELAY_TOPIC`` topic and sent as the first frame of every chunk stream. Receivers gossip
:class:`RelayProgress` on the same topic (informational: status and progress bars).
:func:`verify_manifest` checks the signature over the payload bytes as received, decodes them
(every field checked by the codec, every cross-field rule by ``ManifestBody.check``) and
returns a :class:`Manifest`: the body, its signer's peer id and its id (the envelope's content
hash, which names the version everywhere: chunk requests, the chunk store, the CLI).

A chunk's hash is ``crypto.merkle.leaf_hash(chunk_bytes)`` (BLAKE2b-256, leaf-personalised), so
``merkle_root == merkle_root_of_hashes(chunk_hashes)`` and a chunk can later be proven against
the root alone. The artifact is namespaced by its signer: ``(signer, name)`` is the key that
versions are monotonic in, so no other key can publish a version of it.

A node that missed the gossip asks holders with :class:`ManifestQuery`. A model is the artifact
named by its weights hash (:func:`model_artifact_name`): every holder of the same file, cut in
``MODEL_CHUNK_SIZE`` chunks, signs a manifest with the same chunk hashes, so a fetcher pulls
the content from all of them at once (protocol/relay/machine.py: twins).

Chunk streams (node/relay/service.py): the requester opens a stream and writes the
``RelayManifest`` frame, then any number of :class:`ChunkRequest` frames; the server answers each
with a :class:`ChunkHeader` frame followed, when its status is ``OK``, by exactly ``size`` raw
bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from crypto.envelope import Envelope, EnvelopeError
from crypto.hashing import HASH_LEN
from crypto.keys import Identity
from crypto.merkle import leaf_hash, merkle_root_of_hashes
from protocol.codec import Message, decode, encode, limits, message
from protocol.errors import InvalidMessage

MANIFEST_DOMAIN = "symphony/relay/manifest/v1"
#: short gossip topic name (the driver adds the network id)
RELAY_TOPIC = "relay"

MAX_NAME_LEN = 64
#: chunk hashes per manifest: 8192 * 34 bytes keeps a manifest far below gossip's 1 MiB cap.
MAX_CHUNKS = 8192
MIN_CHUNK_SIZE = 4 * 1024
MAX_CHUNK_SIZE = 64 * 1024 * 1024
MAX_VERSION = (1 << 53) - 1
#: recipients named in one manifest (the relay plan covers them). This bounds what one
#: manifest can make a node hold: its plan takes about 8 MB at 10,000 recipients and 8 stripes;
#: and 10,000 recipients (52-character peer ids) with MAX_CHUNKS hashes still fit one gossip
#: message (0.9 MB; the codec's frame limit is 1 MiB)
MAX_RECIPIENTS = 10_000
MAX_PEER_ID_LEN = 64
#: advertised upload bandwidth, bytes per second (0 = unknown; the plan assumes a default)
MAX_UPLOAD_BPS = 1 << 40
MAX_REASON_LEN = 64
#: chunk size of model artifacts: every holder of a model cuts it alike, so the chunk hashes
#: (and the Merkle root) of its manifests agree and any holder can serve any of them
MODEL_CHUNK_SIZE = 1 << 20
#: stripes a progress report can describe (protocol/relay/striping.py allows up to 16)
MAX_PROGRESS_STRIPES = 16


class ArtifactFormat(enum.Enum):
    SAFETENSORS = "safetensors"
    GGUF = "gguf"
    LORA_DELTA = "lora-delta"
    RAW = "raw"


class ChunkStatus(enum.Enum):
    OK = 0
    #: the server does not hold this version and is not fetching it
    NOT_HELD = 1
    #: the server has too many requests queued from this peer
    BUSY = 2
    #: the server gave the version up (superseded) or does not know the manifest
    GONE = 3


@message(92)
@dataclass(frozen=True, slots=True, kw_only=True)
class Recipient(Message):
    peer_id: str = limits(max_len=MAX_PEER_ID_LEN)
    upload_bps: int = limits(lo=0, hi=MAX_UPLOAD_BPS)


def chunk_count(total_size: int, chunk_size: int) -> int:
    return -(-total_size // chunk_size)


@message(90)
@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestBody(Message):
    name: str = limits(max_len=MAX_NAME_LEN)
    version: int = limits(lo=1, hi=MAX_VERSION)
    total_size: int = limits(lo=1, hi=MAX_CHUNKS * MAX_CHUNK_SIZE)
    chunk_size: int = limits(lo=MIN_CHUNK_SIZE, hi=MAX_CHUNK_SIZE)
    chunk_hashes: tuple[bytes, ...] = limits(size=HASH_LEN, max_items=MAX_CHUNKS)
    merkle_root: bytes = limits(size=HASH_LEN)
    format: ArtifactFormat
    base_version: int | None = limits(lo=1, hi=MAX_VERSION)
    publisher_upload_bps: int = limits(lo=0, hi=MAX_UPLOAD_BPS)
    recipients: tuple[Recipient, ...] = limits(max_items=MAX_RECIPIENTS)

    def check(self) -> None:
        if not self.name:
            raise ValueError("artifact name is empty")
        expected = chunk_count(self.total_size, self.chunk_size)
        if len(self.chunk_hashes) != expected:
            raise ValueError(
                f"{len(self.chunk_hashes)} chunk hashes for {self.total_size} bytes in "
                f"{self.chunk_size}-byte chunks (expected {expected})"
            )
        if merkle_root_of_hashes(self.chunk_hashes) != self.merkle_root:
            raise ValueError("merkle root does not match the chunk hashes")
        if self.base_version is not None and self.base_version >= self.version:
            raise ValueError(f"base version {self.base_version} is not below {self.version}")
        ids = [r.peer_id for r in self.recipients]
        if len(set(ids)) != len(ids):
            raise ValueError("a recipient is listed twice")

    def chunk_span(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of chunk ``index`` in the artifact."""
        if not 0 <= index < len(self.chunk_hashes):
            raise IndexError(f"chunk {index} out of range 0..{len(self.chunk_hashes) - 1}")
        offset = index * self.chunk_size
        return offset, min(self.chunk_size, self.total_size - offset)


@message(91)
@dataclass(frozen=True, slots=True, kw_only=True)
class RelayManifest(Message):
    """A signed ``ManifestBody``: gossiped on ``RELAY_TOPIC``, first frame of chunk streams."""

    envelope: Envelope


@message(93)
@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkRequest(Message):
    repeatable: ClassVar[bool] = True
    manifest_id: bytes = limits(size=HASH_LEN)
    index: int = limits(lo=0, hi=MAX_CHUNKS - 1)


@message(94)
@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkHeader(Message):
    """Answer to a ChunkRequest; with status OK, ``size`` raw bytes follow the frame."""

    manifest_id: bytes = limits(size=HASH_LEN)
    index: int = limits(lo=0, hi=MAX_CHUNKS - 1)
    status: ChunkStatus
    size: int = limits(lo=0, hi=MAX_CHUNK_SIZE)


@message(95)
@dataclass(frozen=True, slots=True, kw_only=True)
class RelayProgress(Message):
    """Sent by a receiver to its plan children and the publisher at milestones and on
    completion: for status, progress bars and the stall rule (protocol/relay/fetching.py)."""

    repeatable: ClassVar[bool] = True

    manifest_id: bytes = limits(size=HASH_LEN)
    chunks_held: int = limits(lo=0, hi=MAX_CHUNKS)
    #: chunks held per stripe of the plan (stripe k: chunks k, k + s, ...)
    stripes_held: tuple[int, ...] = limits(
        max_items=MAX_PROGRESS_STRIPES, lo=0, hi=MAX_CHUNKS, default=()
    )


@message(96)
@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestQuery(Message):
    """Unicast: "send me the manifest of the newest version of ``name`` you hold complete".
    The answer is a ``RelayManifest`` (nothing when none is held): how a node that missed
    the gossip finds the holders of an artifact, such as a model named by its weights hash."""

    repeatable: ClassVar[bool] = True
    name: str = limits(max_len=MAX_NAME_LEN)


class ManifestError(ValueError):
    """A RelayManifest is not validly signed, or its body is malformed."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """A verified manifest: what the relay machine and the chunk store work with."""

    id: bytes
    signer: str
    body: ManifestBody
    message: RelayManifest

    @property
    def name(self) -> str:
        return self.body.name

    @property
    def version(self) -> int:
        return self.body.version

    @property
    def chunk_hashes(self) -> tuple[bytes, ...]:
        return self.body.chunk_hashes

    @property
    def chunks(self) -> int:
        return len(self.body.chunk_hashes)

    @property
    def key(self) -> tuple[str, str]:
        """The artifact: versions are monotonic per ``(signer, name)``."""
        return (self.signer, self.body.name)

    def chunk_span(self, index: int) -> tuple[int, int]:
        return self.body.chunk_span(index)


def chunk_hash(data: bytes) -> bytes:
    return leaf_hash(data)


def verify_manifest(msg: RelayManifest) -> Manifest:
    """Check the signature over the bytes received, then decode and check the body. Pure: a
    function of ``msg`` alone, whose result is never mutated (a driver may share it through a
    ``protocol.machine.Memo``)."""
    try:
        payload = msg.envelope.verify(MANIFEST_DOMAIN)
        body = decode(payload, ManifestBody)
    except (EnvelopeError, InvalidMessage) as exc:
        raise ManifestError(str(exc)) from None
    return Manifest(
        id=msg.envelope.content_hash, signer=msg.envelope.signer, body=body, message=msg
    )


def sign_manifest(identity: Identity, body: ManifestBody) -> Manifest:
    """Sign ``body`` (checked first: our own misuse raises ManifestError) and verify it back."""
    try:
        body.check()
    except ValueError as exc:
        raise ManifestError(f"refusing to sign a bad manifest: {exc}") from None
    envelope = Envelope.sign(identity, MANIFEST_DOMAIN, encode(body))
    return verify_manifest(RelayManifest(envelope=envelope))


def make_body(
    *,
    name: str,
    version: int,
    chunk_size: int,
    chunk_hashes: Sequence[bytes],
    total_size: int,
    format: ArtifactFormat = ArtifactFormat.RAW,
    base_version: int | None = None,
    publisher_upload_bps: int = 0,
    recipients: Sequence[tuple[str, int]] = (),
) -> ManifestBody:
    """A body with its Merkle root computed from ``chunk_hashes``."""
    hashes = tuple(chunk_hashes)
    return ManifestBody(
        name=name,
        version=version,
        total_size=total_size,
        chunk_size=chunk_size,
        chunk_hashes=hashes,
        merkle_root=merkle_root_of_hashes(hashes) if hashes else b"\0" * HASH_LEN,
        format=format,
        base_version=base_version,
        publisher_upload_bps=publisher_upload_bps,
        recipients=tuple(Recipient(peer_id=p, upload_bps=b) for p, b in recipients),
    )


def model_artifact_name(weights_hash: bytes) -> str:
    """The relay name of a model: its weights hash (BLAKE2b-256 of the file) in hex."""
    if len(weights_hash) != HASH_LEN:
        raise ValueError(f"a weights hash is {HASH_LEN} bytes, got {len(weights_hash)}")
    return weights_hash.hex()


def model_weights_hash(manifest: Manifest) -> bytes | None:
    """The weights hash a GGUF artifact named by one must hash to (None: not a model)."""
    name = manifest.name
    if manifest.body.format is not ArtifactFormat.GGUF or len(name) != 2 * HASH_LEN:
        return None
    try:
        return bytes.fromhex(name)
    except ValueError:
        return None


def same_content(a: Manifest, b: Manifest) -> bool:
    """Whether two manifests (of any signers) describe the same bytes, chunk for chunk."""
    return (a.body.merkle_root == b.body.merkle_root and a.body.chunk_size == b.body.chunk_size
            and a.body.total_size == b.body.total_size)
