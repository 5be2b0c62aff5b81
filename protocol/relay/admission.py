"""Which relay manifests a node keeps, and how many: the admission rule of the relay machine.

Contract
--------
* A node plans a version (protocol/relay/striping.py: up to 10,000 recipients, megabytes of
  plan) only when it takes part in it: as its publisher, as a recipient the manifest names
  (``names_recipient``), or because it asked for the artifact (``FetchVersion``). Any other
  valid manifest is only remembered (``ManifestBook.known``, no plan, nothing fetched), so a
  stranger's manifest costs a node its bytes and a signature check, never a plan. A known
  manifest is planned the moment the node asks for its artifact.
* Kept manifests are capped, counting every version held (planned or known) whose signer is
  not this node: at most ``max_per_signer`` of one signer and ``max_total`` in all. A new
  version of an artifact already kept is always admitted (it supersedes the unfinished one,
  and complete versions per artifact are bounded by the machine's ``keep_versions``), so the
  caps bound the artifacts a node follows.
* A manifest of a new artifact whose signer is at its cap first evicts that signer's oldest
  merely-known manifest; with none to evict it is refused. Either way the peer that sent it
  (for gossip, its origin) is penalized ``FLOOD_PENALTY``: one signer filling its cap is
  flooding. At the total cap the oldest known manifest of the signer holding the most goes
  first (no penalty: the sender may be the victim of someone else's flood); with no known
  manifest to evict, the new one is refused and its sender penalized.
* Evicting a known manifest forgets its artifact's newest version too, when nothing else of
  that artifact is kept, so that bookkeeping stays bounded as well.
Pure bookkeeping: the machine (protocol/relay/machine.py) decides when to ask.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from protocol.errors import LocalProtocolError
from protocol.machine import Effect, Penalize
from protocol.relay.manifest import Manifest
from protocol.relay.transfer import manifest_event

#: manifests of one other signer a node keeps (planned or known)
MAX_MANIFESTS_PER_SIGNER = 16
#: manifests of other signers a node keeps in all
MAX_MANIFESTS = 256
#: penalty for a manifest beyond its signer's cap, or refused at the total cap
FLOOD_PENALTY = 10


def names_recipient(manifest: Manifest, peer: str) -> bool:
    """Whether ``manifest`` lists ``peer`` among its recipients."""
    return any(r.peer_id == peer for r in manifest.body.recipients)


class ManifestBook:
    """The manifests a node remembers without planning, and the caps (module docstring)."""

    def __init__(self, self_id: str, *, max_per_signer: int, max_total: int) -> None:
        if max_per_signer < 1 or max_total < 1:
            raise LocalProtocolError("max_per_signer and max_total must be >= 1")
        self.self_id = self_id
        self.max_per_signer = max_per_signer
        self.max_total = max_total
        #: manifest id -> a valid manifest this node takes no part in, oldest first
        self.known: dict[bytes, Manifest] = {}

    def admit(
        self, manifest: Manifest, peer: str, planned: Iterable[Manifest], out: list[Effect]
    ) -> list[Manifest] | None:
        """Make room for ``manifest`` (sent by ``peer``) among the kept ones, ``planned``
        and ``known``: the known manifests evicted for it, or None when there is no room
        (the penalty and the event are in ``out``)."""
        if manifest.signer == self.self_id:
            return []
        kept = [m for m in planned if m.signer != self.self_id]
        kept.extend(self.known.values())
        if any(m.key == manifest.key for m in kept):
            return []
        signers = Counter(m.signer for m in kept)
        evicted: list[Manifest] = []
        if signers[manifest.signer] >= self.max_per_signer:
            out.append(Penalize(peer, "relay manifest flood: signer over its cap", FLOOD_PENALTY))
            victim = self._oldest_known(manifest.signer)
            if victim is None:
                out.append(manifest_event("manifest_refused", manifest, peer=peer, cap="signer"))
                return None
            evicted.append(victim)
            signers[victim.signer] -= 1
        if sum(signers.values()) >= self.max_total:
            candidates = [m for m in self.known.values() if m not in evicted]
            if not candidates:
                out.append(Penalize(peer, "relay manifest flood: no room", FLOOD_PENALTY))
                out.append(manifest_event("manifest_refused", manifest, peer=peer, cap="total"))
                return None
            # the oldest of the signer holding the most (ties broken by peer id)
            heaviest = max({m.signer for m in candidates}, key=lambda s: (signers[s], s))
            evicted.append(next(m for m in candidates if m.signer == heaviest))
        for m in evicted:
            del self.known[m.id]
            out.append(manifest_event("manifest_evicted", m, for_signer=manifest.signer))
        return evicted

    def _oldest_known(self, signer: str) -> Manifest | None:
        return next((m for m in self.known.values() if m.signer == signer), None)

    def forget_key(self, key: tuple[str, str]) -> None:
        """Forget every known manifest of artifact ``key`` (a newer version superseded it)."""
        for mid in [mid for mid, m in self.known.items() if m.key == key]:
            del self.known[mid]
