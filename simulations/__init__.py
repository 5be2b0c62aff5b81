"""The swarm simulator: thousands of virtual nodes running the real protocol/ machines.

``symphony simulate SCENARIO [--nodes N] [--seed S] [--out DIR]`` runs a scenario (a TOML
file, shipped ones in simulations/scenarios/) and writes ``report.json`` and ``report.html``.

Layers, bottom up (the core is the flat modules; the rest are subpackages):

* engine.py: the seeded discrete-event loop (heap of ``(time_us, seq, callback)``);
* network.py: bandwidth, latency (distribution or region matrix), loss, duplication,
  partitions; transport.py: connections, unicast with ``SendFailed``, gossip meshes;
  wire/: frames (wire framing), gossip (planned floods and hop-by-hop gossip), flood planning;
* node.py / swarm.py: virtual nodes hosting machines through ``handle``/``next_deadline``
  exactly as node/driver.py does, performing their effects; metrics.py counts what happens;
* machines/: one adapter per protocol/ machine (ledger, market, verification, relay,
  membership, discovery) performing its machine-specific effects, and adversary.py, the
  behaviours that wrap honest machines;
* compute/: the compute cost model, the real models/ backend, the cost of verification;
* workloads/: one module per research question, returning a runner.report.Report;
  rl/: the RL runs its workload sweeps;
* memo.py: the results of pure functions (envelope checks, hashes, plans) shared by a
  swarm's machines, which call them through the memo they are built with;
* scenario.py loads TOML; runner/: the world a scenario builds, the run, the report.

Determinism: a scenario and a seed give a byte-identical report.json.
"""
