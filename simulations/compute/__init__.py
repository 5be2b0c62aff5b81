"""What answers a node's ``StartCompute`` in the simulator, and what it costs.

* cost.py: device profiles, the question bank with ground truth, and the cost model
  (time = tokens / device speed, answers drawn from each executor's skill);
* models_backend.py: the real models/ backend in the cost model's place (``[compute]
  backend = "models"``);
* verification.py: the cost of commitment-based verification (what executors commit, what a
  verifier's check costs).
"""
