"""The ``[nat]`` config section: AutoNAT, circuit relay v2 and hole punching, one value each.

No libp2p here (the CLI and the config loader import it without starting a host). Every
limit is what a peer may cost this node; going past one is refused on the wire with the
protocol's own status code (``RESOURCE_LIMIT_EXCEEDED``, ``E_DIAL_REFUSED``) or ends the
circuit, and is a tested error. See node/p2p/nat.py for what runs when.
"""

from __future__ import annotations

from dataclasses import dataclass

#: relay_service values: relay for others only while AutoNAT says we are public, always, never
RELAY_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class NatConfig:
    #: ask connected peers to dial us back, to learn whether we are publicly reachable
    #: (answering others' requests is always on, within the limits below)
    autonat: bool = True
    #: how often the NAT loop looks at what is due: a newly connected peer to ask, a
    #: reservation to make, refresh or drop (node/p2p/nat.py)
    tick_s: float = 1.0
    #: seconds between AutoNAT rounds (the first one runs as soon as a peer is connected)
    autonat_interval_s: float = 60.0
    #: peers asked per round; the verdict is the majority of the last answers
    autonat_peers_per_round: int = 3
    #: a dial-back we make for a peer gives up after this long
    dialback_timeout_s: float = 5.0
    #: dial-backs we run for others at once (a dial-back costs a TCP connect and a handshake)
    max_concurrent_dialbacks: int = 4
    #: dial-back requests one peer may make per minute
    dialback_requests_per_peer_per_min: int = 6
    #: "auto": relay for others while AutoNAT says we are public; "on": always; "off": never
    relay_service: str = "auto"
    #: reserve a slot on a relaying peer while AutoNAT says we are private
    relay_client: bool = True
    #: ... and whatever AutoNAT says (a node that knows it cannot be dialled; benchmarks)
    reserve_always: bool = False
    #: upgrade relayed connections to direct ones by hole punching (DCUtR)
    hole_punch: bool = True
    #: reservations this node holds for others at once
    max_reservations: int = 64
    #: how long a reservation lasts before its holder must refresh it
    reservation_ttl_s: int = 3600
    #: hop requests (reserve, connect) one peer may make per minute
    hop_requests_per_peer_per_min: int = 30
    #: relayed connections through this node at once, and per peer at either end
    max_circuits: int = 32
    max_circuits_per_peer: int = 4
    #: a relayed connection is closed after this long
    circuit_max_s: int = 1800
    #: ... or after this many bytes in either direction
    circuit_max_bytes: int = 64 << 20
    #: each direction of a relayed connection is paced to this many bytes per second
    circuit_rate_bytes_per_s: int = 1 << 20

    def __post_init__(self) -> None:
        if self.relay_service not in RELAY_MODES:
            raise ValueError(f"nat.relay_service must be one of {', '.join(RELAY_MODES)}, "
                             f"got {self.relay_service!r}")
        for name, value in vars(self).items():
            if isinstance(value, bool) or isinstance(value, str):
                continue
            if not value > 0:
                raise ValueError(f"nat.{name} must be positive, got {value!r}")
