"""`symphony bench verify`: commitment and check costs on the real model (bench.py) and the
protocol round from a reveal to a verdict (verdict.py)."""
