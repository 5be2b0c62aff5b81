"""Twins and partial fetches: the same bytes under several signers' manifests, and a fetch of
only some chunks. Pure helpers of protocol/relay/machine.py.

Contract
--------
* Two manifests of one name by different signers are twins when they describe the same bytes
  chunk for chunk (``same_content``: the Merkle root over the chunk hashes, the chunk size and
  the total size agree). Versions of one artifact ``(signer, name)`` are never twins: a newer
  one supersedes (protocol/relay/machine.py). Every holder of a model file signs a manifest of its own for it (the artifact
  named by the weights hash, cut in ``MODEL_CHUNK_SIZE`` chunks), so a fetcher meets twins.
* A fetcher plans one of them (the first it accepts) and counts every other twin's signer, and
  every peer it asked (``ManifestQuery``) that answers with the same content, as a holder of
  that transfer (``Transfer.holders``): it requests chunks from all of them at
  once (protocol/relay/fetching.py). A signer vouches for the content it signs: when a model's
  bytes fail their weights hash, the planned signer and every holder are penalized.
* A node that holds a version complete and meets a twin (new, or remembered from before it
  held the bytes) plans the twin too: its store already
  holds every chunk (content-addressed), so it completes at once and serves chunk requests
  made under the twin's id, which is how a fetcher pulls one manifest from several holders.
* ``wanted`` (``FetchVersion.only``) narrows a transfer to some chunk indices; asking again
  widens it (``widen``), and the requests still pending are rebuilt from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.machine import Effect, Penalize, Send
from protocol.relay.events import FetchVersion
from protocol.relay.manifest import Manifest, ManifestQuery, same_content
from protocol.relay.transfer import Transfer, TransferState, manifest_event

#: for signing (or vouching for, as a twin's signer) a model whose bytes fail its weights hash
BAD_CONTENT_PENALTY = 100

#: states in which a transfer's content is held or being fetched (a twin joins it)
_LIVE = (TransferState.PREPARING, TransferState.FETCHING, TransferState.COMPLETE)


def find_twin(transfers: Iterable[Transfer], manifest: Manifest) -> Transfer | None:
    """A live transfer of another manifest with the same content, complete ones first."""
    twins = [
        t for t in transfers
        if t.manifest.name == manifest.name and t.manifest.signer != manifest.signer
        and t.state in _LIVE
        and same_content(t.manifest, manifest)
    ]
    twins.sort(key=lambda t: t.state is not TransferState.COMPLETE)
    return twins[0] if twins else None


def take_held_twin(
    known: dict[bytes, Manifest], transfers: Iterable[Transfer], manifest: Manifest
) -> bool:
    """``manifest`` was remembered unplanned (heard before we held its bytes) and is now a
    twin of a version we hold complete: take it out of ``known`` (the machine plans it)."""
    twin = find_twin(transfers, manifest)
    if twin is None or twin.state is not TransferState.COMPLETE:
        return False
    del known[manifest.id]
    return True


def add_holder(t: Transfer, peer: str, self_id: str) -> bool:
    """Count ``peer`` as holding ``t``'s content; whether it is new."""
    if peer == self_id or peer in t.holders or peer == t.manifest.signer:
        return False
    t.holders.append(peer)
    return True


def merge_only(a: frozenset[int] | None, b: frozenset[int] | None) -> frozenset[int] | None:
    """The union of two wanted sets (None: every chunk)."""
    if a is None or b is None:
        return None
    return a | b


def widen(t: Transfer, only: frozenset[int] | None, *, fresh: bool = False) -> None:
    """Want ``only`` as well (None: everything; ``fresh``: instead of what was wanted, for a
    transfer nobody asked for yet), and rebuild the requests still pending."""
    t.wanted = only if fresh else merge_only(t.wanted, only)
    stripes = t.plan.stripes
    t.pending = [
        [
            i for i in range(k, t.manifest.chunks, stripes)
            if t.wants(i) and not t.have[i] and i not in t.in_flight
        ]
        for k in range(stripes)
    ]


def reject_content(
    t: Transfer, known: dict[bytes, Manifest], reason: str, self_id: str, out: list[Effect]
) -> None:
    """``t``'s bytes failed a check of the whole (``RejectVersion``): penalize its signer and
    every holder that signed a twin, and forget those twins (the machine's newest-version
    record keeps a replay of any of them stale). The machine then abandons ``t``."""
    for peer in (t.manifest.signer, *t.holders):
        if peer != self_id:
            out.append(Penalize(peer, f"relay content rejected: {reason}", BAD_CONTENT_PENALTY))
    for m in [m for m in known.values() if m.name == t.manifest.name and m.signer in t.holders]:
        del known[m.id]
    out.append(manifest_event("rejected", t.manifest, reason=reason))


class Wants:
    """The artifacts a node asked for (``FetchVersion``), by (signer or None, name), and the
    chunk indices wanted of each (None: all)."""

    def __init__(self) -> None:
        self._wanted: dict[tuple[str | None, str], frozenset[int] | None] = {}
        #: name -> the peers sent a ManifestQuery for it
        self._queried: dict[str, set[str]] = {}

    def add(self, event: FetchVersion, self_id: str, out: list[Effect]) -> None:
        """Record the ask (widening an earlier one) and query the peers it names."""
        key = (event.signer, event.name)
        self._wanted[key] = (
            merge_only(self._wanted[key], event.only) if key in self._wanted else event.only
        )
        for peer in event.ask:
            if peer != self_id:
                self._queried.setdefault(event.name, set()).add(peer)
                out.append(Send(peer, ManifestQuery(name=event.name)))

    def answered(self, transfers: Iterable[Transfer], manifest: Manifest, peer: str,
                 self_id: str) -> list[Transfer]:
        """``peer``, asked for ``manifest``'s artifact, sent it (its own or one it holds as a
        twin): count it as a holder of every transfer of that content being fetched; those
        that gained it."""
        if peer not in self._queried.get(manifest.name, ()):
            return []
        return [t for t in transfers
                if t.manifest.name == manifest.name and same_content(t.manifest, manifest)
                and t.state in (TransferState.PREPARING, TransferState.FETCHING)
                and add_holder(t, peer, self_id)]

    def asked(self, manifest: Manifest) -> bool:
        wanted = self._wanted
        return (manifest.signer, manifest.name) in wanted or (None, manifest.name) in wanted

    def only(self, manifest: Manifest) -> frozenset[int] | None:
        """The chunks asked for of ``manifest``'s artifact (None: all, or not asked for)."""
        keys = [(manifest.signer, manifest.name), (None, manifest.name)]
        asked = [self._wanted[k] for k in keys if k in self._wanted]
        if not asked:
            return None
        return asked[0] if len(asked) == 1 else merge_only(asked[0], asked[1])
