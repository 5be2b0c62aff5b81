"""One artifact version as a relay node sees it: its transfer state and the chunks it holds.

Contract
--------
* A ``Transfer`` moves only along ``TRANSITIONS`` (``move_to``; any other move raises
  ``LocalProtocolError``): KNOWN -> PREPARING -> FETCHING -> COMPLETE (PREPARING -> COMPLETE
  when the store already holds every chunk), and from any other state to ABANDONED.
* ``mark_present`` records held chunks and serves every peer waiting for one of them;
  ``forget_waiter`` drops a departed peer's waiting requests. Neither ever sees chunk bytes.
* ``manifest_event`` names every observable relay event after its artifact version.
protocol/relay/machine.py owns the transfers and decides when each of these happens.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError
from protocol.machine import Effect, Emit
from protocol.relay.events import ServeChunk
from protocol.relay.manifest import Manifest
from protocol.relay.striping import StripedPlan


class TransferState(enum.Enum):
    KNOWN = "known"  # heard of, not fetching, nothing to serve
    PREPARING = "preparing"  # waiting for VersionPrepared (local store scan)
    FETCHING = "fetching"
    COMPLETE = "complete"
    ABANDONED = "abandoned"  # superseded, dropped by GC


TRANSITIONS: dict[TransferState, frozenset[TransferState]] = {
    TransferState.KNOWN: frozenset({TransferState.PREPARING, TransferState.ABANDONED}),
    TransferState.PREPARING: frozenset(
        {TransferState.FETCHING, TransferState.COMPLETE, TransferState.ABANDONED}
    ),
    TransferState.FETCHING: frozenset({TransferState.COMPLETE, TransferState.ABANDONED}),
    TransferState.COMPLETE: frozenset({TransferState.ABANDONED}),
    TransferState.ABANDONED: frozenset(),
}

@dataclass
class Transfer:
    manifest: Manifest
    plan: StripedPlan
    state: TransferState
    have: bytearray
    have_count: int = 0
    #: per stripe, a heap of the chunk indices still to request
    pending: list[list[int]] = field(default_factory=list)
    in_flight: dict[int, str] = field(default_factory=dict)
    #: stripe -> the peer its chunks are requested from now
    sources: dict[int, str] = field(default_factory=dict)
    #: peer -> when it last sent us a chunk, or became a source
    heard_at_ms: dict[str, int] = field(default_factory=dict)
    #: chunks held per stripe of the plan
    stripe_have: list[int] = field(default_factory=list)
    #: peer -> chunks it reported holding per stripe
    stripe_progress: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: no source can count as stalled before this (protocol/relay/fetching.py)
    check_at_ms: int | None = None
    #: peer -> when its progress report last showed it holding more chunks
    advanced_at_ms: dict[str, int] = field(default_factory=dict)
    #: dropped plan parent -> the chunk we waited for, while its reports said it lacked it
    suspects: dict[str, int] = field(default_factory=dict)
    #: suspect -> when it is reported, unless a chunk from it arrives first
    suspect_due: dict[str, int] = field(default_factory=dict)
    #: peer -> permanent (a bad chunk) or not (cleared when every source has failed)
    failed: dict[str, bool] = field(default_factory=dict)
    retry_at_ms: int | None = None
    waiting: dict[int, list[str]] = field(default_factory=dict)
    queued: Counter[str] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)
    #: chunk hash -> the indices that carry it (``chunk_indices``; read only)
    by_hash: Mapping[bytes, tuple[int, ...]] = field(default_factory=dict)
    #: chunks held by other peers, from their RelayProgress gossip
    progress: dict[str, int] = field(default_factory=dict)
    reported: int = 0
    #: the publisher's: when it gossips the manifest, None once it has (or never will)
    announce_at_ms: int | None = None
    #: the publisher's: recipients that reported holding the whole version
    completed_reports: int = 0
    #: chunks held at our last progress report (-1: none sent)
    last_report: int = -1
    #: signers of twin manifests (the same content, protocol/relay/twins.py): they hold it too
    holders: list[str] = field(default_factory=list)
    #: the chunk indices this node fetches (None: all); a block server wants only its tensors
    wanted: frozenset[int] | None = None

    @property
    def source(self) -> str | None:
        """The first stripe's current source (for status)."""
        return self.sources.get(0)

    @property
    def complete(self) -> bool:
        return self.have_count == self.manifest.chunks

    def wants(self, index: int) -> bool:
        return self.wanted is None or index in self.wanted

    @property
    def satisfied(self) -> bool:
        """Every wanted chunk is held (the whole version unless ``wanted`` says otherwise)."""
        if self.wanted is None:
            return self.complete
        return all(self.have[i] for i in self.wanted if 0 <= i < len(self.have))

    def move_to(self, new: TransferState) -> None:
        """Change state along ``TRANSITIONS``; any other move is our own bug."""
        if new not in TRANSITIONS[self.state]:
            raise LocalProtocolError(
                f"relay transfer cannot go from {self.state.value} to {new.value}"
            )
        self.state = new

    def mark_present(self, indices: Iterable[int], out: list[Effect] | None = None) -> None:
        """Record chunks as held; peers waiting for them are served (into ``out``, if given)."""
        for index in indices:
            if 0 <= index < len(self.have) and not self.have[index]:
                self.have[index] = 1
                self.have_count += 1
                if self.stripe_have:
                    self.stripe_have[index % len(self.stripe_have)] += 1
                for peer in self.plan.serve_order(index, self.waiting.pop(index, ())):
                    self.queued[peer] -= 1
                    self.served[peer] += 1
                    if out is not None:
                        out.append(ServeChunk(peer, self.manifest.id, index))

    def forget_waiter(self, peer: str) -> None:
        """Drop every request ``peer`` has waiting here (it went away)."""
        if not self.queued.pop(peer, 0):
            return
        for index in list(self.waiting):
            self.waiting[index] = [p for p in self.waiting[index] if p != peer]
            if not self.waiting[index]:
                del self.waiting[index]


def chunk_indices(hashes: tuple[bytes, ...]) -> dict[bytes, tuple[int, ...]]:
    """Each distinct chunk hash -> the indices that carry it, ascending (equal chunks are
    fetched once). Pure: a function of the manifest, read only once made (a driver may share
    one copy among its machines through a ``protocol.machine.Memo``)."""
    out: dict[bytes, list[int]] = {}
    for i, h in enumerate(hashes):
        out.setdefault(h, []).append(i)
    return {h: tuple(ix) for h, ix in out.items()}


def manifest_event(event: str, manifest: Manifest, **fields: object) -> Emit:
    """An observable event about one artifact version, named by name, version and id."""
    return Emit(
        event,
        {"name": manifest.name, "version": manifest.version, "id": manifest.id.hex(), **fields},
    )
