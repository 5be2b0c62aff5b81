"""`symphony bench distributed`: layer-sharded chains on real daemons (bench.py) and the set
of daemons they run on (testnet.py)."""
