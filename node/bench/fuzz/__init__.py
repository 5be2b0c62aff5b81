"""`symphony bench fuzz`: hostile peers against a live daemon (bench.py), the frames they send
(frames.py), the identities they connect as (identities.py) and the attacker process
(attacker.py)."""
