"""How the relay machine answers a chunk request (protocol/relay/machine.py calls it).

A held chunk is served at once; one of a version being fetched (and wanted here) waits, at
most ``max_queued`` per peer, until it is stored; anything else is refused with a
``ChunkStatus`` that says why: NOT_HELD (a version known but not held, or a chunk this
node does not fetch), GONE (unknown, abandoned, or an index out of range, which also costs
the asker ``BAD_REQUEST_PENALTY``), BUSY (its queue here is full).
"""

from __future__ import annotations

from protocol.machine import Effect, Penalize
from protocol.relay.events import ChunkRequested, RefuseChunk, ServeChunk
from protocol.relay.manifest import ChunkStatus
from protocol.relay.transfer import Transfer, TransferState

BAD_REQUEST_PENALTY = 5


def answer_request(
    t: Transfer | None, ev: ChunkRequested, known: bool, max_queued: int, out: list[Effect]
) -> None:
    """Serve, queue or refuse ``ev``; ``t`` is its version's transfer, ``known`` whether the
    version is merely remembered (protocol/relay/admission.py)."""
    if t is None and known:
        out.append(RefuseChunk(ev.peer, ev.manifest_id, ev.index, ChunkStatus.NOT_HELD))
    elif t is None or t.state is TransferState.ABANDONED:
        out.append(RefuseChunk(ev.peer, ev.manifest_id, ev.index, ChunkStatus.GONE))
    elif ev.index >= t.manifest.chunks:
        out.append(Penalize(ev.peer, f"relay chunk {ev.index} out of range", BAD_REQUEST_PENALTY))
        out.append(RefuseChunk(ev.peer, ev.manifest_id, ev.index, ChunkStatus.GONE))
    elif t.have[ev.index]:
        t.served[ev.peer] += 1
        out.append(ServeChunk(ev.peer, ev.manifest_id, ev.index))
    elif t.state not in (TransferState.PREPARING, TransferState.FETCHING) or not t.wants(ev.index):
        out.append(RefuseChunk(ev.peer, ev.manifest_id, ev.index, ChunkStatus.NOT_HELD))
    elif t.queued[ev.peer] >= max_queued:
        out.append(RefuseChunk(ev.peer, ev.manifest_id, ev.index, ChunkStatus.BUSY))
    else:
        t.queued[ev.peer] += 1
        t.waiting.setdefault(ev.index, []).append(ev.peer)
