"""``result_to_verdict_ms`` of `symphony bench verify`: a requester, an executor and two
verifiers' protocol machines run in one process on a FIFO with virtual time, with real
solutions and real checks, timed from the requester taking the executor's reveal to its
decision (network hops left out). ``fetch_states`` serves a check's layer-state leaves from the
executor's store as node/verification/state_streams.py would, minus the network, and
``check_result`` is one verifier's whole check of a committed result on them.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Any

from models.checks import CheckRunner, LayerJob
from models.commitments import CHUNK_TOKENS, Commitments
from protocol.market.messages import TaskSpec
from protocol.verification.verifier import StartCheck


def fetch_states(store: Any, e: StartCheck, job: LayerJob, sizes: list[int] | None = None,
                 task_id: bytes | None = None) -> dict:
    """What node/verification/state_streams.py's fetch_leaves does, minus the network: serve,
    prove, decode. The bytes fetched are appended to ``sizes``."""
    from models.layer_states import leaf_index, n_blocks
    from node.verification.state_streams import open_leaf

    blocks = n_blocks(job.plan.total_tokens)
    wanted = {leaf_index(la, b, blocks): (la, b) for la, b in job.wanted}
    got = {}
    total = 0
    for index, leaf, proof in store.leaves(task_id or e.task.task_id, e.states_root,
                                           sorted(wanted)):
        got[wanted[index]] = open_leaf(e.states_root, e.state_layers * blocks, index,
                                       wanted[index], leaf, proof)
        total += len(leaf) + len(proof)
    if sizes is not None:
        sizes.append(total)
    return got


def check_result(runner: CheckRunner, store: Any, chunks: tuple[int, ...],
                 layers: tuple[int, ...], sizes: list[int] | None, task: TaskSpec,
                 made: Commitments, output: list[int], cot: str, answer: str) -> bool:
    """One verifier's whole check of committed layer states: binding, fetch, re-run; the
    bytes fetched are appended to ``sizes``."""
    e = StartCheck(
        check_id=bytes(32), task=task, model_hash=runner.model_hash, output_ids=tuple(output),
        answer=answer, cot=cot, chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
        fingerprints=tuple(made.fingerprints[c] for c in chunks), deadline_at_ms=0,
        executor="e", states_root=made.states_root, state_layers=made.state_layers,
        layers=layers)
    job = runner.prepare(e)
    if not isinstance(job, LayerJob):
        return job.passed
    return runner.run_layers(e, job, fetch_states(store, e, job, sizes)).passed


def result_to_verdict_ms(runner: CheckRunner, store: Any,
                         solved: list[tuple[TaskSpec, Any, Commitments]],
                         rounds: int) -> list[float]:
    """Run requester, executor and two verifiers' machines with the real checks, in-process."""
    from crypto.keys import Identity
    from protocol.market.auction import AuctionConfig, SubmitTask
    from protocol.market.executor import ExecutorConfig, ServedModel
    from protocol.market.selection import ScoreSelector
    from protocol.verification.executor import VerifiedExecutor
    from protocol.verification.requester import VerifiedAuction, VerifyConfig
    from protocol.verification.verifier import Verifier, VerifierConfig

    ids = {name: Identity.from_seed(bytes([n]) * 32) for n, name in enumerate(
        ("requester", "executor", "v1", "v2"), start=1)}
    model = ServedModel("smollm2", "smollm2", 8192, runner.model_hash, 50.0, 0.0)
    verifiers = [ids["v1"].peer_id, ids["v2"].peer_id]
    auction = VerifiedAuction(ids["requester"], ScoreSelector(), random.Random(1),
                              AuctionConfig(bid_window_ms=10, spare_bids=0),
                              verify=VerifyConfig(sample_rate=1.0, verifiers=2),
                              verifier_candidates=lambda h, now: verifiers)
    machines: dict[str, Any] = {
        ids["requester"].peer_id: auction,
        ids["executor"].peer_id: VerifiedExecutor(ids["executor"], ExecutorConfig(
            models=(model,), max_tokens=4096), random.Random(2)),
        **{p: Verifier(ids[n], VerifierConfig(frozenset({runner.model_hash})))
           for p, n in zip(verifiers, ("v1", "v2"), strict=True)},
    }
    loop = _Loop(machines, runner, store, ids["executor"].peer_id)
    for r in range(rounds):
        task, sol, made = solved[r % len(solved)]
        loop.now = r * 1_000_000
        loop.solution = (sol, made)
        loop.perform(ids["requester"].peer_id, auction.handle(SubmitTask(
            question=task.question, answer_type=task.answer_type, choices=task.choices,
            deadline_ms=600_000, k=1, max_tokens=256, task_id=bytes([r + 1]) * 32), loop.now))
        loop.states_of = task.task_id  # where the executor's store keeps this solution's states
        loop.run_until_decided()
    return loop.times or [float("nan")]


class _Loop:
    """A FIFO of (machine, event) with virtual time; checks and solutions are real."""

    def __init__(self, machines: dict[str, Any], runner: CheckRunner, store: Any,
                 executor: str) -> None:
        self.machines, self.runner, self.executor = machines, runner, executor
        self.store = store
        self.states_of = b""
        self.queue: deque[tuple[str, object]] = deque()
        self.now = 0
        self.solution: tuple[Any, Commitments] | None = None
        self.revealed_at = 0.0
        self.times: list[float] = []

    def perform(self, src: str, effects: list[object]) -> None:
        from protocol.machine import Emit, Publish, Received, Send
        from protocol.market.events import ComputeDone
        from protocol.market.executor import StartCompute
        from protocol.verification.messages import Reveal

        for e in effects:
            if isinstance(e, Send):
                if isinstance(e.message, Reveal):
                    self.revealed_at = time.perf_counter()
                self.queue.append((e.peer, Received(src, e.message)))
            elif isinstance(e, Publish):
                self.queue.append((self.executor, Received(src, e.message, e.topic)))
            elif isinstance(e, StartCompute) and self.solution is not None:
                sol, made = self.solution
                self.queue.append((src, ComputeDone(
                    task_id=e.task.task_id, attempt=e.attempt, answer=sol.answer,
                    cot=sol.cot_text, confidence=sol.confidence, tokens=len(sol.token_ids),
                    compute_ms=1, model_hash=self.runner.model_hash,
                    fingerprints=made.fingerprints, output_ids=tuple(sol.token_ids),
                    states_root=made.states_root, state_layers=made.state_layers)))
            elif isinstance(e, StartCheck):
                job = self.runner.prepare(e)
                done = job if not isinstance(job, LayerJob) else \
                    self.runner.run_layers(e, job, fetch_states(self.store, e, job,
                                                          task_id=self.states_of))
                self.queue.append((src, done))
            elif isinstance(e, Emit) and e.event == "verify.decided":
                self.times.append((time.perf_counter() - self.revealed_at) * 1000)

    def run_until_decided(self) -> None:
        from protocol.machine import Tick

        before = len(self.times)
        while len(self.times) == before:
            if self.queue:
                dest, event = self.queue.popleft()
                self.perform(dest, self.machines[dest].handle(event, self.now))
                continue
            deadlines = [(d, p) for p, m in self.machines.items()
                         if (d := m.next_deadline()) is not None]
            if not deadlines:
                return
            at, peer = min(deadlines)
            self.now = max(self.now, at)
            self.perform(peer, self.machines[peer].handle(Tick(), self.now))
