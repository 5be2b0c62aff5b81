"""What a frame of py-libp2p's protobuf protocols must be before py-libp2p's handler sees it.

The guard's framing (node/p2p/framing.py, ``Framing.check``) runs these on each whole frame
body of gossipsub (``/meshsub/1.x``) and identify push; a check raises for a frame that no
honest peer sends, and the peer is penalized (node/penalties.py) instead of the frame being
dropped for free:

* :func:`check_identify`: a body that is no Identify message, or one in which not a single
  field is one identify defines (protobuf parsers keep unknown fields, so random bytes
  often parse; an honest push always carries its addresses and protocols): "undecodable";
* :func:`check_gossip_rpc`: the same for a gossipsub RPC (a non-empty RPC with no
  subscription, message or control in it), and a published message without a signature
  and key: "invalid". Our network runs gossipsub with strict signing, so every honest
  message is signed by its author; py-libp2p 0.8.1 drops an unsigned one without a word
  (and one for a topic we do not subscribe to before looking at it), which made sending them
  free.

:func:`libp2p_framings` is the table the transport builds its guard with: how the guard
follows the frames of each py-libp2p protocol, with these checks where they apply.
"""

from __future__ import annotations

from libp2p.host.ping import ID as PING_ID
from libp2p.host.ping import PING_LENGTH
from libp2p.identity.identify.pb.identify_pb2 import Identify
from libp2p.identity.identify_push.identify_push import ID_PUSH as IDENTIFY_PUSH_ID
from libp2p.pubsub.pb.rpc_pb2 import RPC

from node.p2p.framing import Framing, PeerFault
from node.p2p.gossip import GOSSIP_PROTOCOLS
from node.runtime.limits import NetLimits

#: inbound ping streams py-libp2p 0.8.1's PingService serves per peer (its own fixed cap)
PING_STREAMS_PER_PEER = 2


def libp2p_framings(limits: NetLimits) -> dict[str, Framing]:
    """Protocol id -> how the guard follows the frames of py-libp2p's handler for it."""
    framings = {
        str(protocol): Framing(max_frame=limits.gossip_max_rpc_bytes, long_lived=True,
                               check=check_gossip_rpc)
        for protocol in GOSSIP_PROTOCOLS
    }
    # py-libp2p's identify-push handler swallows a parse error: check each frame here
    framings[str(IDENTIFY_PUSH_ID)] = Framing(
        max_frame=limits.identify_max_frame_bytes, check=check_identify,
        max_frames_per_min=limits.identify_push_frames_per_min)
    # py-libp2p's ping service resets a peer's third ping stream without a word: the guard
    # refuses it first, as a flood
    framings[str(PING_ID)] = Framing(
        fixed_size=PING_LENGTH, max_frames_per_min=limits.ping_frames_per_min,
        max_streams=PING_STREAMS_PER_PEER)
    return framings


def check_identify(body: bytes) -> None:
    message = Identify()
    message.ParseFromString(body)  # DecodeError for bytes that are no protobuf
    if body and not message.ListFields():
        raise PeerFault("undecodable", f"a {len(body)}-byte identify with no identify field")


def identify_answer(body: bytes) -> tuple[list[str], str]:
    """The protocols and agent an identify answer (its body, unframed) announces."""
    message = Identify()
    message.ParseFromString(body)
    return [str(p) for p in message.protocols], str(message.agent_version)


def check_gossip_rpc(body: bytes) -> None:
    rpc = RPC()
    rpc.ParseFromString(body)  # DecodeError for bytes that are no protobuf
    if body and not rpc.ListFields():
        raise PeerFault("undecodable", f"a {len(body)}-byte RPC with no gossipsub field")
    for message in rpc.publish:
        if not message.signature or not message.key:
            raise PeerFault("invalid", "an unsigned gossip message")
