"""Hosting commitment-based verification: VerifiedAuction, VerifiedExecutor and Verifier.

As node/verification/service.py does for the daemon, with the same protocol calls: the
requester runs ``protocol.verification.candidates.verified_auction`` (verifier candidates and
network-wide exclusions read from the node's ledger machine, the auction's options, possible
bidders included, as simulations/machines/market.py gives them), executors run
``VerifiedExecutor`` with the protocol's Terms grace and the ``Verifier`` role; every
``protocol.ledger.events.Attest`` goes to the node's ledger machine.

Compute is simulations/compute/verification.py: executors commit layer states (captured during
generation, then hashed), and a ``StartCheck`` first fetches the leaves it needs from the
executor over the network model (an executor that is down or cut off makes it
``CheckFailed``, as in the daemon), then re-runs the drawn layers; its verdict follows what
the executor faked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.view import LedgerView
from protocol.market.events import AuctionConfig
from protocol.market.messages import Assign, Beacon, Bid, Cancel, Reject, Result
from protocol.market.selection import Selector
from protocol.verification.candidates import verified_auction
from protocol.verification.executor import VerifiedExecutor
from protocol.verification.messages import TO_EXECUTOR, TO_REQUESTER, TO_VERIFIER
from protocol.verification.state import VerifyConfig
from protocol.verification.verifier import (
    CancelCheck,
    CheckDone,
    CheckFailed,
    StartCheck,
    Verifier,
    VerifierConfig,
)
from simulations.compute.verification import CheckCost, CheckWork, CommittingCost, fingerprints
from simulations.machines.adversary import unwrap
from simulations.machines.market import (
    AUCTION,
    EXECUTOR,
    auction_spec,
    executor_spec,
    ledger_options,
)
from simulations.node import MachineSpec, VirtualNode

VERIFIER = "verifier"
_CHECKS = "verify.running"
#: a verifier gives up on an executor that does not answer its states request after this long
STATES_TIMEOUT_MS = 10_000


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
        def view() -> LedgerView | None:
            slot = node.slots.get("ledger")
            return None if slot is None else unwrap(slot.machine).view

        return verified_auction(node.identity, selector_of(node), node.rng, config,
                                ledger_options(node), verify, view)

    def attest(node: VirtualNode, name: str, effect: LedgerAttest) -> None:
        if on_attest is not None:
            on_attest(node, effect)
        _to_ledger(node, name, effect)

    return dataclasses.replace(
        base,
        build=build,
        message_types=(Bid, Result, Reject, *TO_REQUESTER),
        performers={**base.performers, LedgerAttest: attest},
    )


def verified_executor_spec(
    config_of: Callable[[VirtualNode], Any], backend: CommittingCost
) -> MachineSpec:
    base = executor_spec(config_of, backend)

    def build(node: VirtualNode) -> Any:
        return VerifiedExecutor(node.identity, config_of(node), node.rng)

    return dataclasses.replace(
        base, build=build, message_types=(Beacon, Assign, Cancel, *TO_EXECUTOR)
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
        done: object
        if lazy(node):  # a lazy verifier says "pass" without computing or fetching
            delay_us, done = 1000, CheckDone(effect.check_id, True, "")
        else:
            delay_us, done = _checked(node, effect, checks.work(effect))
        running = node.store.setdefault(_CHECKS, {})
        running[effect.check_id] = node.epoch
        node.swarm.loop.after(delay_us, _finish_check, node, effect.check_id, done)

    def cancel(node: VirtualNode, name: str, effect: CancelCheck) -> None:
        node.store.get(_CHECKS, {}).pop(effect.check_id, None)

    def attest(node: VirtualNode, name: str, effect: LedgerAttest) -> None:
        if on_attest is not None:
            on_attest(node, effect)
        _to_ledger(node, name, effect)

    return MachineSpec(
        name=VERIFIER,
        build=build,
        message_types=TO_VERIFIER,
        performers={StartCheck: start, CancelCheck: cancel, LedgerAttest: attest},
    )


def _checked(node: VirtualNode, job: StartCheck, work: CheckWork) -> tuple[int, object]:
    """(delay in us, the event) of a check: the fetch of the executor's states, then compute.

    As in the daemon, an executor that cannot be reached for its states makes the check fail
    to run (``CheckFailed``: the requester asks another verifier), not fail the executor."""
    delay_us = 0
    if work.fetch_bytes:
        swarm = node.swarm
        source = swarm.node_of(job.executor)
        if source is None or not source.up or not swarm.net.reachable(source.index, node.index):
            return STATES_TIMEOUT_MS * 1000, CheckFailed(job.check_id, "executor unreachable")
        swarm.metrics.add_bytes("states", work.fetch_bytes)
        source.bytes_sent += work.fetch_bytes
        node.bytes_received += work.fetch_bytes
        now = swarm.loop.now_us
        request_us = swarm.net.base_latency_us(node.index, source.index)
        arrivals = swarm.net.transfer(source.index, node.index, work.fetch_bytes, now)
        # a bulk stream retransmits what the network model drops: one more round trip
        arrived = arrivals[0] if arrivals else now + 3 * request_us
        delay_us = request_us + arrived - now
    return delay_us + work.compute_ms * 1000, CheckDone(job.check_id, work.passed, work.detail)


def _finish_check(node: VirtualNode, check_id: bytes, done: object) -> None:
    if node.store.get(_CHECKS, {}).pop(check_id, None) == node.epoch and node.up:
        node.submit(VERIFIER, done)


__all__ = [
    "AUCTION",
    "EXECUTOR",
    "VERIFIER",
    "CheckCost",
    "CommittingCost",
    "fingerprints",
    "verified_auction_spec",
    "verified_executor_spec",
    "verifier_spec",
]
