"""`symphony bench agents`: the multi-step question set (models/data/planset.jsonl) on a local
testnet of real daemons in three modes (bench.py), and the report's figures (report.py)."""
