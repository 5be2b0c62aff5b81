"""RL runs in virtual time: a learner fed by rollout workers through the protocol's job book.

* setup.py: one run's parameters and figures, and how long a new policy version takes to
  reach each worker;
* run.py: the run itself (simulations/workloads/rl.py sweeps it).
"""
