"""`symphony bench rl`: a GRPO run and its capacity figures (bench.py), and adapters published
through the weight relay to worker daemons (swaps.py)."""
