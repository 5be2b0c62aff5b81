"""Hosting commitment-based verification: VerifiedAuction, VerifiedExecutor and Verifier.

As node/verification/service.py does for the daemon: the requester runs
``protocol.verification.requester.VerifiedAuction`` (candidates for verification are ledger peers with
the verifier role whose model offer has the result's model hash), executors run
``VerifiedExecutor`` and the ``Verifier`` role; every ``protocol.ledger.events.Attest`` goes
to the node's ledger machine.

Simulated fingerprints (the compute model's side of issue 6): the fingerprint of chunk i of
an output is ``H(model hash that really ran, task id, the chunk's token ids, i)``. An honest
executor computes with the model it advertises; a cheater's fingerprints come from another
model (``swap``) or are made up for a fraction of chunks (``fabricate``). A verifier re-runs
the prefill with the claimed model: ``StartCheck`` passes iff every sampled fingerprint equals
the recomputed one, after ``chunks * chunk_tokens * PREFILL_FACTOR / tokens_per_s`` seconds.
That compute time is what the cost figure adds up.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from crypto.hashing import digest
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import Role
from protocol.market.selection import Selector
from protocol.market.events import AuctionConfig, ComputeDone, StartCompute
from protocol.market.messages import Assign, Beacon, Bid, Cancel, Reject, Result
from protocol.verification.requester import VerifiedAuction
from protocol.verification.executor import DEFAULT_CHUNK_TOKENS, VerifiedExecutor
from protocol.verification.messages import (
    CheckRequest,
    Commit,
    Reveal,
    RevealRequest,
    Terms,
    Verdict,
)
from protocol.verification.state import VerifyConfig
from protocol.verification.verifier import CancelCheck, CheckDone, StartCheck, Verifier, VerifierConfig
from simulations.adversary import unwrap
from simulations.compute import PREFILL_FACTOR, CostModel
from simulations.machines.market import AUCTION, EXECUTOR, auction_spec, executor_spec
from simulations.node import MachineSpec, VirtualNode

VERIFIER = "verifier"
_CHECKS = "verify.running"


def fingerprint(model_hash: bytes, task_id: bytes, ids: tuple[int, ...], index: int) -> bytes:
    raw = b"".join(i.to_bytes(4, "big") for i in ids)
    return digest(model_hash + task_id + raw + index.to_bytes(4, "big"), person=b"sim-fp")[:16]


def fingerprints(
    model_hash: bytes,
    task_id: bytes,
    ids: tuple[int, ...],
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[bytes, ...]:
    return tuple(
        fingerprint(model_hash, task_id, ids[i : i + chunk_tokens], i // chunk_tokens)
        for i in range(0, len(ids), chunk_tokens)
    )


class FingerprintedCost:
    """The cost model plus token ids and fingerprints, honest or per the node's cheat mode.

    ``node.profile.cheat``: "" (honest), "swap" (another model computed every chunk) or
    "fabricate:<fraction>" (that fraction of chunks made up).
    """

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.compute_ms = 0

    def compute(
        self, profile: Any, job: StartCompute, rng: random.Random
    ) -> tuple[int, object | None]:
        duration, outcome = self.cost.compute(profile, job, rng)
        if not isinstance(outcome, ComputeDone):
            return duration, outcome
        self.compute_ms += duration
        ids = tuple(rng.randrange(32_000) for _ in range(outcome.tokens))
        cheat: str = getattr(profile, "cheat", "")
        ran = outcome.model_hash if cheat != "swap" else digest(b"a cheaper model", person=b"sim")
        prints = list(fingerprints(ran, job.task.task_id, ids))
        if cheat.startswith("fabricate:"):
            share = float(cheat.split(":", 1)[1])
            for i in range(len(prints)):
                if rng.random() < share:
                    prints[i] = rng.randbytes(16)
        return duration, dataclasses.replace(outcome, output_ids=ids, fingerprints=tuple(prints))


class CheckCost:
    """Verifier compute: the prefill of the sampled chunks with the claimed model."""

    def __init__(self, tokens_per_s: float) -> None:
        self.tokens_per_s = tokens_per_s
        self.check_ms = 0
        self.checks = 0

    def run(self, job: StartCheck) -> tuple[int, CheckDone]:
        ct = job.chunk_tokens
        passed = True
        for index, fp in zip(job.chunk_indices, job.fingerprints, strict=False):
            ids = job.output_ids[index * ct : (index + 1) * ct]
            if fingerprint(job.model_hash, job.task.task_id, ids, index) != fp:
                passed = False
        tokens = len(job.chunk_indices) * ct
        duration = max(1, int(tokens * PREFILL_FACTOR / self.tokens_per_s * 1000))
        self.check_ms += duration
        self.checks += 1
        return duration, CheckDone(job.check_id, passed, "" if passed else "fingerprint mismatch")


def _to_ledger(node: VirtualNode, name: str, effect: LedgerAttest) -> None:
    node.swarm.metrics.count(f"verify_attest.{effect.kind.value}")
    if "ledger" in node.slots:
        node.submit("ledger", effect)


def verified_auction_spec(
    selector_of: Callable[[VirtualNode], Selector],
    config: AuctionConfig,
    verify: VerifyConfig,
    on_attest: Callable[[VirtualNode, LedgerAttest], None] | None = None,
) -> MachineSpec:
    base = auction_spec(selector_of, config)

    def build(node: VirtualNode) -> Any:
        def reputation(peer: str) -> float:
            slot = node.slots.get("ledger")
            if slot is None:
                return 0.5
            return float(
                unwrap(slot.machine).view.reputation(peer, node.swarm.machine_now_ms).score
            )

        def candidates(model_hash: bytes, now: int) -> list[str]:
            slot = node.slots.get("ledger")
            if slot is None:
                return []
            view = unwrap(slot.machine).view
            return [
                m.peer_id
                for m in view.find_peers(now, role=Role.VERIFIER)
                if any(o.weights_hash == model_hash for o in m.record.models)
            ]

        return VerifiedAuction(
            node.identity,
            selector_of(node),
            node.rng,
            config,
            reputation,
            verify=verify,
            verifier_candidates=candidates,
        )

    def attest(node: VirtualNode, name: str, effect: LedgerAttest) -> None:
        if on_attest is not None:
            on_attest(node, effect)
        _to_ledger(node, name, effect)

    return dataclasses.replace(
        base,
        build=build,
        message_types=(Bid, Result, Reject, Commit, Reveal, Verdict),
        performers={**base.performers, LedgerAttest: attest},
    )


def verified_executor_spec(
    config_of: Callable[[VirtualNode], Any], backend: FingerprintedCost
) -> MachineSpec:
    base = executor_spec(config_of, backend)

    def build(node: VirtualNode) -> Any:
        return VerifiedExecutor(node.identity, config_of(node), node.rng)

    return dataclasses.replace(
        base, build=build, message_types=(Beacon, Assign, Cancel, Terms, RevealRequest)
    )


def verifier_spec(
    model_hashes: frozenset[bytes],
    checks: CheckCost,
    lazy: Callable[[VirtualNode], bool] = lambda node: False,
    on_attest: Callable[[VirtualNode, LedgerAttest], None] | None = None,
) -> MachineSpec:
    def build(node: VirtualNode) -> Any:
        return Verifier(node.identity, VerifierConfig(model_hashes=model_hashes, slots=2))

    def start(node: VirtualNode, name: str, effect: StartCheck) -> None:
        duration, done = checks.run(effect)
        if lazy(node):  # a lazy verifier says "pass" without computing
            duration, done = 1, CheckDone(effect.check_id, True, "")
        running = node.store.setdefault(_CHECKS, {})
        running[effect.check_id] = node.epoch
        node.swarm.loop.after(duration * 1000, _finish_check, node, effect.check_id, done)

    def cancel(node: VirtualNode, name: str, effect: CancelCheck) -> None:
        node.store.get(_CHECKS, {}).pop(effect.check_id, None)

    def attest(node: VirtualNode, name: str, effect: LedgerAttest) -> None:
        if on_attest is not None:
            on_attest(node, effect)
        _to_ledger(node, name, effect)

    return MachineSpec(
        name=VERIFIER,
        build=build,
        message_types=(CheckRequest,),
        performers={StartCheck: start, CancelCheck: cancel, LedgerAttest: attest},
    )


def _finish_check(node: VirtualNode, check_id: bytes, done: CheckDone) -> None:
    if node.store.get(_CHECKS, {}).pop(check_id, None) == node.epoch and node.up:
        node.submit(VERIFIER, done)


__all__ = [
    "AUCTION",
    "EXECUTOR",
    "VERIFIER",
    "CheckCost",
    "FingerprintedCost",
    "fingerprints",
    "verified_auction_spec",
    "verified_executor_spec",
    "verifier_spec",
]
