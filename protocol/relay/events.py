"""Events and effects of the relay machine (protocol/relay/machine.py), shared with its drivers.

Chunks are ``(manifest_id, index)``: no bytes and no file handles cross this interface, so the
node's relay service and the simulator perform the very same effects.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.relay.manifest import ChunkStatus, Manifest

# ---------------------------------------------------------------- events (driver -> machine)


@dataclass(frozen=True, slots=True)
class PublishVersion:
    """Local: we signed ``manifest`` and hold every chunk of it."""

    manifest: Manifest


@dataclass(frozen=True, slots=True)
class FetchVersion:
    """Local: fetch the newest version of ``name`` (from ``signer``, or any trusted signer).

    ``ask``: peers sent a ``ManifestQuery`` for it (holders the ledger names, for a node that
    missed the gossip). ``only``: the chunk indices wanted (None: all); asking again widens
    the set (a block server fetches the header first, then its tensors' chunks)."""

    name: str
    signer: str | None = None
    ask: tuple[str, ...] = ()
    only: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class RejectVersion:
    """Local: the whole of a complete version failed a check the manifest cannot express (a
    model's bytes do not hash to the weights hash it is named by): its signer and every
    holder that vouched for the same content lied."""

    manifest_id: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class Restore:
    """Local, at start: a manifest saved before a restart and the chunks the store holds."""

    manifest: Manifest
    present: frozenset[int]


@dataclass(frozen=True, slots=True)
class VersionPrepared:
    manifest_id: bytes
    present: frozenset[int]


@dataclass(frozen=True, slots=True)
class ChunkRequested:
    peer: str
    manifest_id: bytes
    index: int


@dataclass(frozen=True, slots=True)
class ChunkReceived:
    """``peer`` sent chunk ``index``; ``digest`` is ``chunk_hash`` of the bytes received."""

    peer: str
    manifest_id: bytes
    index: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class ChunkFailed:
    peer: str
    manifest_id: bytes
    index: int
    reason: str
    status: ChunkStatus | None = None
    #: > 0 when the peer broke the stream protocol (the machine penalizes it)
    penalty: int = 0


@dataclass(frozen=True, slots=True)
class StreamClosed:
    """``peer`` closed its chunk stream for this version: forget what it was waiting for."""

    peer: str
    manifest_id: bytes


# ---------------------------------------------------------------- effects (machine -> driver)


@dataclass(frozen=True, slots=True)
class PrepareVersion:
    manifest: Manifest


@dataclass(frozen=True, slots=True)
class RequestChunk:
    peer: str
    manifest_id: bytes
    index: int


@dataclass(frozen=True, slots=True)
class StoreChunk:
    """Keep the verified bytes of ``index`` received from ``peer`` (they may now be served)."""

    peer: str
    manifest_id: bytes
    index: int


@dataclass(frozen=True, slots=True)
class DiscardChunk:
    peer: str
    manifest_id: bytes
    index: int


@dataclass(frozen=True, slots=True)
class ServeChunk:
    peer: str
    manifest_id: bytes
    index: int


@dataclass(frozen=True, slots=True)
class RefuseChunk:
    peer: str
    manifest_id: bytes
    index: int
    status: ChunkStatus


@dataclass(frozen=True, slots=True)
class AttestBadChunk:
    """Evidence for the ledger: ``peer`` sent bytes for ``index`` that do not match."""

    peer: str
    manifest_id: bytes
    index: int
    expected: bytes
    got: bytes


@dataclass(frozen=True, slots=True)
class AttestWithheld:
    """Evidence for the ledger: ``peer``, our parent in the plan, stalled with our requests
    in flight (a free rider sends nothing; an honest parent reports its own progress)."""

    peer: str
    manifest_id: bytes


@dataclass(frozen=True, slots=True)
class VersionComplete:
    """Every chunk of ``manifest`` is stored: a node serving the artifact may switch to it."""

    manifest: Manifest


@dataclass(frozen=True, slots=True)
class DropVersion:
    """Stop transfers of this version; its chunks may be garbage-collected."""

    manifest_id: bytes
    reason: str
