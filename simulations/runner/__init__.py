"""Running a scenario: the world it builds, the run itself, and the report it writes.

* world.py: a swarm built from a scenario (bandwidth classes, topology, partitions, churn);
* run.py: picks the scenario's workload, runs it and times it; ``symphony simulate``
  (node/cli/simulate.py) calls it;
* report.py: ``report.json`` and ``report.html``.
"""
