"""The membership machine's local commands (events from its own node, not from peers): the
bootstrap peers and the peers met before to dial, and this node's own listen addresses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AddBootstrap:
    """Multiaddrs ending in /p2p/<peer id>; these peers are redialled forever."""

    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AddKnown:
    """Multiaddrs ending in /p2p/<peer id> of peers met before (the node's peer store): dialled
    like peers learnt by exchange, after the bootstrap peers, and forgotten the same way."""

    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SetListenAddrs:
    addrs: tuple[str, ...]
