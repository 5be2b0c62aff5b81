"""Protocol ids and gossip topics. Every one carries the network id, so testnets never mix."""

from __future__ import annotations

import re

NETWORK_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
PROTOCOL_VERSION = 1


def check_network_id(network_id: str) -> str:
    if not NETWORK_ID_RE.match(network_id):
        raise ValueError(
            f"network id {network_id!r} must be 1-32 chars of lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return network_id


def protocol_id(network_id: str, name: str, version: int = PROTOCOL_VERSION) -> str:
    """A libp2p stream protocol id, e.g. ``/symphony/mainnet/ledger-sync/1``."""
    return f"/symphony/{network_id}/{name}/{version}"


def topic(network_id: str, name: str, version: int = PROTOCOL_VERSION) -> str:
    """A gossipsub topic, e.g. ``symphony/mainnet/ledger/1``."""
    return f"symphony/{network_id}/{name}/{version}"


def peer_id_of_multiaddr(addr: str) -> str | None:
    """The peer id after the last ``/p2p/`` in a multiaddr, or None when it has none.

    A relayed address names two peers, ``<relay>/p2p/<relay id>/p2p-circuit/p2p/<id>``: the
    one it reaches is the last."""
    parts = addr.rstrip("/").split("/")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in ("p2p", "ipfs"):
            return parts[i + 1]
    return None
