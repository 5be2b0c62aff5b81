"""Forgetting peers gone for long from py-libp2p's in-memory peer store.

py-libp2p's peer store keeps every peer the host ever heard of (addresses, public key,
protocols, metadata, latency) until a hard cap of its own, whether or not the peer is still
around: on a network with churn it grows with every peer id ever seen. :class:`PeerStorePruner`
sweeps it every ``PRUNE_INTERVAL_S``: a peer not connected is marked absent at the first sweep
that finds it so, and a peer absent for ``forget_after_s`` (connected at no sweep in between,
dialled by no ``touch``) is dropped. This node's own entry (its key pair) is never touched.
What the daemon keeps across restarts is node/p2p/peerstore.py's, not this.

No libp2p here: the host hands in its peer store's ids as strings and a function that drops one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

#: a peer gone this long is dropped from the in-memory peer store
FORGET_GONE_S = 30 * 60.0
#: how often the host sweeps its peer store
PRUNE_INTERVAL_S = 60.0


class PeerStorePruner:
    def __init__(self, own: str, forget_after_s: float = FORGET_GONE_S) -> None:
        if forget_after_s <= 0:
            raise ValueError("forget_after_s must be positive")
        self.own = own
        self.forget_after_s = forget_after_s
        #: peer -> when a sweep first found it absent (bounded by the peer store's ids)
        self.absent_since: dict[str, float] = {}
        self.forgotten = 0

    def touch(self, peer: str) -> None:
        """``peer`` is being dialled: it is not gone (its fresh addresses stay)."""
        self.absent_since.pop(peer, None)

    def sweep(self, known: Iterable[str], connected: Collection[str], now: float,
              forget: Callable[[str], None]) -> list[str]:
        """Mark the absent peers among ``known``, ``forget`` those absent long enough; the
        peers forgotten."""
        known = set(known)
        gone: list[str] = []
        for peer in sorted(known):
            if peer == self.own or peer in connected:
                self.absent_since.pop(peer, None)
                continue
            since = self.absent_since.setdefault(peer, now)
            if now - since >= self.forget_after_s:
                gone.append(peer)
        for peer in gone:
            forget(peer)
            del self.absent_since[peer]
        for peer in [p for p in self.absent_since if p not in known]:
            del self.absent_since[peer]  # dropped by the store itself
        self.forgotten += len(gone)
        return gone
