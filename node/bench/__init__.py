"""Benchmarks behind `symphony bench NAME`.

Each benchmark is a module here exposing ``run(quick: bool) -> dict[str, float | int | str]``
(those listed in ``OPTIONS`` also take those keyword arguments, e.g. ``--frames``):
one flat dict of named figures. The CLI prints it as a table or, with ``--json``, as one JSON
object. Figures that depend on the machine are reported beside a baseline measured in the same
run (a ratio), because these machines are shared and noisy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

#: name -> module path; modules are imported lazily so `symphony --help` stays fast.
BENCHMARKS: dict[str, str] = {
    "transport": "node.bench.transport.bench",
    "models": "node.bench.models",
    "ledger": "node.bench.ledger",
    "tasks": "node.bench.tasks.bench",
    "verify": "node.bench.verify.bench",
    "relay": "node.bench.relay",
    "fuzz": "node.bench.fuzz.bench",
    "soak": "node.bench.soak",
    "simulate": "node.bench.simulate",
    "rl": "node.bench.rl.bench",
    "distributed": "node.bench.distributed.bench",
    "gpu": "node.bench.gpu.bench",
    "agents": "node.bench.agents.bench",
    "scale": "node.bench.scale.bench",
}


#: options some benchmarks take beside --quick (keyword arguments of their ``run``); ``link``
#: (a link spec, node/p2p/link.py) puts every daemon the benchmark starts behind that link
#: (node.testnet.LocalTestnet's ``link``) and adds a ``link`` figure echoing it
OPTIONS: dict[str, tuple[str, ...]] = {
    "fuzz": ("frames",),
    "soak": ("cycles",),
    "verify": ("honest", "only"),
    "tasks": ("link", "concurrency"),
    "distributed": ("link",),
    "relay": ("link",),
    "ledger": ("link",),
    "gpu": ("model", "only"),
    "agents": ("model", "seed"),
    "scale": ("nodes",),
    "simulate": ("nodes",),
}


def chosen_parts(only: str, parts: Sequence[str]) -> list[str]:
    """The ``parts`` of a benchmark that ``--only`` names (comma-separated; "" = all), in the
    order they run; ``ValueError`` naming any unknown one."""
    named = [p.strip() for p in only.split(",") if p.strip()] if only else list(parts)
    unknown = sorted(set(named) - set(parts))
    if unknown:
        raise ValueError(f"--only: unknown parts {unknown}; choose from {', '.join(parts)}")
    return [p for p in parts if p in named]


def load(name: str) -> Callable[..., dict[str, Any]]:
    module = importlib.import_module(BENCHMARKS[name])
    run: Callable[..., dict[str, Any]] = module.run
    return run
