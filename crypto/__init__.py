"""Keys, peer ids, signed envelopes, hashes and Merkle trees. Pure: no network, no clock."""
