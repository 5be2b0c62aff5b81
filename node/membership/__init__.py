"""Who this node is connected to: the membership service (Hello, pings, peer exchange, whom to
dial; service.py) and the discovery service beside it (signed rendezvous records;
discovery.py). Both drive protocol/membership/ and share its ``[membership]`` config section."""
