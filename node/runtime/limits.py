"""What a peer may cost this node: the network limits, one named value each.

They form the ``[limits]`` section of the node's config (``node.toml``, or
``SYMPHONY_LIMITS__<KEY>``), every field below with its default and meaning. The transport
(node/p2p/) enforces the stream limits on every inbound stream, py-libp2p's own protocols
(gossipsub, identify, ping) included; the driver enforces the message limits on our unicast
protocol; the verification service the states quota. Going past a limit ends that stream or
drops that message, and costs the peer the points node/penalties.py lists for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NetLimits:
    #: a frame that has started must be complete within this long, and a new stream's first
    #: frame must arrive within it (a stall is penalized)
    read_deadline_s: float = 10.0
    #: a short-lived stream (identify push, ping) that makes no progress for this long is
    #: closed, and so is a request/response stream silent this long between two exchanges
    #: (node/p2p/reqresp.py; our own idle ones we close sooner); the long-lived gossip stream
    #: has no idle limit, only the per-protocol stream cap below
    idle_timeout_s: float = 60.0
    #: connections open at once; an inbound one beyond it is closed at once
    max_connections: int = 250
    #: inbound streams one peer may hold open at once, all protocols together
    max_streams_per_peer: int = 64
    #: inbound streams one peer may hold open at once on one protocol
    max_streams_per_protocol: int = 16
    #: streams one peer may open per minute on one protocol (a burst of this many); an honest
    #: peer opens one per session or request: at most 4 a minute on any protocol in the relay
    #: and transport benches (identify, gossip, AutoNAT, relay hop and stop, relay chunks, the
    #: handshake), so a replayed valid request is told apart by its rate alone. The unicast
    #: ``msg``, whose streams each carry any number of messages, is metered per message
    #: instead (``max_messages_per_peer_per_s``)
    streams_opened_per_min: int = 60
    #: inbound gossip streams (``/meshsub/1.x``) one peer may hold open at once; an honest
    #: peer writes on one, and opens a new one when it gives its old one up (py-libp2p does
    #: so without closing the old): a newer stream past this many ends the peer's oldest,
    #: at no cost (node/p2p/guard.py); opening many costs points past streams_opened_per_min
    max_gossip_streams_per_peer: int = 2
    #: largest gossipsub RPC frame accepted (messages plus control); py-libp2p's default
    gossip_max_rpc_bytes: int = 1 << 20
    #: largest gossip message payload published or accepted (leaves room for the RPC framing)
    gossip_max_message_bytes: int = (1 << 20) - (16 << 10)
    #: largest frame on the identify / identify-push streams
    identify_max_frame_bytes: int = 64 << 10
    #: libp2p pings (``/ipfs/ping/1.0.0``) one peer may send per minute, all its streams
    #: together (a burst of this many); an honest peer pings every 15 s or so
    ping_frames_per_min: int = 30
    #: identify pushes one peer may send per minute (a burst of this many); an honest peer
    #: pushes when its addresses or protocols change
    identify_push_frames_per_min: int = 10
    #: unicast messages one peer may send per second (a burst of this many is allowed)
    max_messages_per_peer_per_s: int = 500
    #: identical unicast frames from one peer are counted within this window ...
    replay_window_s: float = 10.0
    #: ... and beyond this many copies in it, each further copy is dropped and penalized
    replay_allowance: int = 3
    #: frames shorter than this are not replay-checked, only rate-limited: they are too short
    #: to carry a signed envelope (32-byte key + 64-byte signature), and small idempotent
    #: requests (a peer-list request) repeat on purpose
    replay_min_bytes: int = 96
    #: states-stream requests one peer may make per minute (a verifier makes one per check)
    states_requests_per_peer_per_min: int = 60
    #: states streams one peer may have served at once
    states_concurrent_per_peer: int = 2
    #: a peer's repeated fault of one kind is logged once, then summarized at most this often
    log_summary_interval_s: float = 60.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"limits.{name} must be positive, got {value!r}")
