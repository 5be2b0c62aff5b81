"""The libp2p transport: the only package of the project that imports libp2p (py-libp2p 0.8.1).

:class:`node.p2p.host.P2PTransport` implements :class:`node.transport.Transport` (read that
module for the contract) over TCP + Noise + yamux; no QUIC (it truncated bulk transfers), no
mplex (5x slower), no TLS/secio/plaintext (a peer offering only those is refused).

* ``host.py``: the transport itself (lifecycle, dials, request/response, bulk streams).
* ``swarm.py``: the libp2p host as we build it (security, muxer, dial settings, identify
  announcing ``symphony-node/<version>``) and the per-peer connect/disconnect tracking.
* ``streams.py``: libp2p streams as :class:`node.transport.BulkStream`.
* ``guard.py``: the guard in front of every inbound stream, py-libp2p's own protocols
  included (the one place py-libp2p's faults are caught); ``framing.py``: following the
  frames of py-libp2p's protocols so oversize, truncated and stalled frames are penalized.
* ``gossip.py``: gossipsub with our settings, subscriptions and paced publishes.
* ``nat.py``: NAT traversal, which runs when: ``autonat.py`` (are we publicly reachable?),
  ``circuit_hop.py`` and ``circuit_client.py`` (circuit relay v2, both sides), ``dcutr.py`` (hole
  punching); ``pbwire.py`` reads their length-delimited protobuf messages, ``natconfig.py``
  is their ``[nat]`` config section.

Nothing is re-exported here: import from the module that defines it.
"""
