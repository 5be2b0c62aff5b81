"""Publish-to-swap over the weight relay, for `symphony bench rl` (``swap_relay_s``).

`bench rl`'s ``swap_s`` is measured between local processes (the adapter handed over by path).
This measures the network path a real run takes: a learner daemon publishes adapter GGUFs a
training run exported (``rl-adapter/<model>``, node/rl/dissemination.py) and rollout-worker
daemons on this machine (llama.cpp, the same base model) fetch each through the relay and switch
to it without reloading the base. The figure per worker and version is the wall-clock time from
the learner's publish call to the adapter being usable in the worker (one host: one clock).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from node.rl.dissemination import adapter_name, run_model_name
from node.testnet import FAST_MEMBERSHIP, LocalTestnet, NodeProcess

#: every relayed version must be usable on every worker within this
SWAP_TIMEOUT_S = 120.0
START_TIMEOUT_S = 300.0
CONFIG = {**FAST_MEMBERSHIP, "executor": {"solver": ""}}


def adapter_version(path: Path) -> int:
    """The policy version an exported adapter carries in its metadata."""
    import gguf

    from models.rl.export import VERSION_KEY

    field = gguf.GGUFReader(str(path)).fields.get(VERSION_KEY)
    if field is None:
        raise ValueError(f"{path} carries no {VERSION_KEY}")
    return int(field.parts[field.data[0]][0])


def _rl_worker(node: NodeProcess) -> dict[str, Any]:
    return node.status()["services"]["rl_worker"]  # type: ignore[no-any-return]


def relayed_swaps(adapters: Sequence[Path], base_dir: Path, *, model: str = "",
                  workers: int = 1, threads: int = 1) -> list[float]:
    """Publish-to-swap seconds of each adapter on each worker (adapters in version order)."""
    from node.rl.network_learner import DaemonApi

    versions = sorted((adapter_version(p), p) for p in adapters)
    net = LocalTestnet(Path(base_dir) / "net", network_id="bench-rl-relay", config=CONFIG,
                       env={"OMP_NUM_THREADS": str(threads)})
    try:
        learner = net.start("learner", timeout_s=START_TIMEOUT_S)
        # this learner only publishes (no jobs, so no beacons a worker would trust it by)
        worker_config = {"rl_worker": {"generator": "models", "model": model, "threads": threads,
                                       "learner": learner.peer_id}}
        nodes = [net.start(f"worker{i}", bootstrap=[learner], wait=False, config=worker_config)
                 for i in range(workers)]
        for node in nodes:
            node.wait_ready(START_TIMEOUT_S)
        net.wait_all_connected(START_TIMEOUT_S)
        net.wait_until(lambda: all(_rl_worker(n)["enabled"] for n in nodes),
                       "every worker's generator up", timeout_s=START_TIMEOUT_S)
        api = DaemonApi.of(learner.data_dir)
        name = adapter_name(run_model_name(model))
        out: list[float] = []
        for version, path in versions:
            at = time.time()
            api.call("POST", "/relay/publish", json={"path": str(path), "name": name,
                                                     "version": version, "format": "gguf"})
            out += _wait_swapped(net, nodes, version, at)
        api.close()
        return out
    finally:
        net.kill_all()


def _wait_swapped(net: LocalTestnet, nodes: list[NodeProcess], version: int,
                  at: float) -> list[float]:
    def swapped() -> list[float] | None:
        times = []
        for node in nodes:
            adapters = _rl_worker(node)["adapters"] or {}
            if adapters.get("failures"):
                raise RuntimeError(f"{node.name} could not take an adapter: {adapters}")
            ready = [s["ready_at"] for s in adapters.get("swaps", []) if s["version"] == version]
            if not ready:
                return None
            times.append(ready[-1] - at)
        return times

    result: list[float] = net.wait_until(swapped, f"version {version} on every worker",
                                         timeout_s=SWAP_TIMEOUT_S)
    return result


def relayed_swaps_of_run(run_dir: Path, workers: int, *, latest: int = 3) -> list[float]:
    """Relay the ``latest`` adapters a `rl train` run wrote under ``run_dir`` to ``workers``
    worker daemons; publish-to-swap seconds of each on each."""
    adapters = sorted(Path(run_dir).glob("adapters/*.gguf"), key=adapter_version)[-latest:]
    if not adapters:
        raise ValueError(f"{run_dir} holds no exported adapters")
    return relayed_swaps(adapters, Path(run_dir).parent / "relay", workers=workers)
