"""Helpers shared by the workloads: running a swarm with progress, capability specs, sizes."""

from __future__ import annotations

from collections.abc import Callable

from protocol.ledger.machine import CapabilitySpec
from protocol.ledger.records import HardwareSummary, ModelOffer, Role
from simulations.compute.cost import DeviceProfile, model_hash
from simulations.node import VirtualNode
from simulations.swarm import Swarm

Progress = Callable[[float, str], None]
MODEL_NAME = "sim-7b"
MODEL_FAMILY = "sim"
#: virtual ms between progress callbacks
PROGRESS_STEP_MS = 5_000


def no_progress(fraction: float, label: str) -> None:
    """The default progress callback: says nothing."""


class Stages:
    """Maps the progress of one run among several onto [0, 1] for the whole scenario."""

    def __init__(self, progress: Progress, weights: list[float]) -> None:
        self.progress = progress
        self.total = sum(weights) or 1.0
        self.weights = weights
        self.done = 0.0
        self.index = 0

    def run(self, swarm: Swarm, until_ms: int, label: str) -> None:
        """Run ``swarm`` to ``until_ms``, reporting this stage's share of the progress."""
        weight = self.weights[self.index] if self.index < len(self.weights) else 0.0
        start = swarm.now_ms
        span = max(1, until_ms - start)
        t = start
        while t < until_ms:
            t = min(until_ms, t + PROGRESS_STEP_MS)
            swarm.run(t)
            frac = (self.done + weight * (t - start) / span) / self.total
            self.progress(min(1.0, frac), label)

    def next(self) -> None:
        if self.index < len(self.weights):
            self.done += self.weights[self.index]
        self.index += 1


def capability(
    node: VirtualNode,
    device: DeviceProfile,
    *,
    slots: int = 2,
    roles: tuple[Role, ...] = (Role.EXECUTOR,),
) -> CapabilitySpec:
    offer = ModelOffer(
        name=MODEL_NAME,
        family=MODEL_FAMILY,
        quantization="q4_k_m",
        context_length=8192,
        weights_hash=model_hash(MODEL_NAME),
        tokens_per_s=device.tokens_per_s,
    )
    hardware = HardwareSummary(
        device_kind="gpu" if device.name != "cpu" else "cpu",
        device_name=device.name,
        memory_bytes=int(device.memory_gb * (1 << 30)),
        cpu_cores=8,
    )
    return CapabilitySpec(
        listen_addrs=(node.addr,),
        models=(offer,),
        hardware=hardware,
        price_per_1k_tokens=device.price_per_1k,
        free_slots=slots,
        max_slots=slots,
        load=0.0,
        roles=roles,
        software_version="sim",
    )


def window_bytes(swarm: Swarm, before: dict[str, int]) -> dict[str, int]:
    """Bytes by kind since the snapshot ``before`` (a copy of ``metrics.bytes_by_kind``)."""
    now = swarm.metrics.bytes_by_kind
    return {k: now[k] - before.get(k, 0) for k in sorted(now) if now[k] - before.get(k, 0)}
