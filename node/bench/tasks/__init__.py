"""`symphony bench tasks`: the eval set through the task market (bench.py) and many concurrent
asks against one daemon (load.py)."""
