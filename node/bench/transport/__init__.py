"""`symphony bench transport`: libp2p latency and throughput (bench.py) against a peer in its
own process (peer.py), time to a first peer by bootstrap and peer store (join.py), by
discovery (discovery.py) and through a circuit relay (circuit.py)."""
