"""`symphony bench gpu`: what a CUDA GPU does for a node (node/bench/gpu/bench.py)."""
