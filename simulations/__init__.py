"""The swarm simulator: thousands of virtual nodes running the real protocol/ machines.

``symphony simulate SCENARIO [--nodes N] [--seed S] [--out DIR]`` runs a scenario (a TOML
file, shipped ones in simulations/scenarios/) and writes ``report.json`` and ``report.html``.

Layers, bottom up:

* engine.py: the seeded discrete-event loop (heap of ``(time_us, seq, callback)``);
* network.py: bandwidth, latency (distribution or region matrix), loss, duplication,
  partitions; transport.py: connections, unicast with ``SendFailed``, gossip meshes;
  gossip.py: planned floods (flood.py) and hop-by-hop gossip; frames.py: wire framing;
* node.py / swarm.py: virtual nodes hosting machines through ``handle``/``next_deadline``
  exactly as node/driver.py does, performing their effects; churn and topology in world.py;
* machines/: one adapter per protocol/ machine (ledger, market, verification, relay,
  membership) performing its machine-specific effects; compute.py is the compute cost model,
  adversary.py the behaviours that wrap honest machines;
* workloads/: one module per research question, returning a report.Report;
  scenario.py loads TOML, runner.py runs and writes, memo.py shares pure-function results.

Determinism: a scenario and a seed give a byte-identical report.json.
"""
