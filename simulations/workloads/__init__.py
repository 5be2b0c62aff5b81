"""Workloads: one module per scenario kind, each answering one research question.

A workload module exposes ``QUESTION`` (one sentence) and
``run(scenario, progress) -> simulations.runner.report.Report``, where ``progress(fraction, label)``
is called as virtual time advances. It builds swarms of real protocol machines
(simulations/machines/), drives them, observes them only through their effects and queries,
and returns figures, tables and plots as data.
"""

WORKLOADS: dict[str, str] = {
    "ledger": "simulations.workloads.ledger",
    "voting": "simulations.workloads.voting",
    "routing": "simulations.workloads.routing",
    "verification": "simulations.workloads.verification",
    "relay": "simulations.workloads.relay",
    "bench": "simulations.workloads.bench",
    "membership": "simulations.workloads.membership",
    "rl": "simulations.workloads.rl",
    "distributed": "simulations.workloads.distributed",
}
