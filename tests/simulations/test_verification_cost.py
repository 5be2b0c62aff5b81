"""The simulator's verification cost model follows the daemon's default layer-state scheme.

A check fetches exactly the leaves ``models.layer_states.needed_leaves`` lists for its plan,
re-runs layer 1 and the drawn layers (far less than the whole re-prefill it replaced), and
fails exactly when a layer it re-runs was faked; the executor pays what the daemon's does to
commit: the state capture and the hashing of its states (a prefill when it keeps none).
"""

from __future__ import annotations

import random

import pytest

from models.layer_states import BLOCK_TOKENS, needed_leaves, plan_check
from protocol.market.events import ComputeDone, StartCompute
from protocol.market.messages import Requirement, TaskSpec
from protocol.verification.verifier import StartCheck
from simulations.compute.cost import DEVICES, CostModel, ExecutorProfile, model_hash, question_bank
from simulations.compute.verification import (
    HIDDEN_SIZE,
    LEAF_HEADER_BYTES,
    MODEL_LAYERS,
    CheckCost,
    CommittingCost,
    commit_ms,
    prefill_ms,
)

DEVICE = DEVICES["rtx3090"]


def task_of(question: str) -> TaskSpec:
    return TaskSpec(task_id=bytes(32), requester="r", question=question, answer_type="number",
                    choices=(), requirement=Requirement(model="m", family="f", min_context=0),
                    k=1, max_price=1.0, max_tokens=1024)


def committed(cheat: str, *, layer_states: bool = True) -> tuple[CommittingCost, ComputeDone, int]:
    rng = random.Random(4)
    bank = question_bank(rng, 5, ("math",))
    q = bank[0]
    backend = CommittingCost(CostModel(bank), layer_states=layer_states)
    profile = ExecutorProfile(device=DEVICE, cheat=cheat)
    duration, done = backend.compute(profile, StartCompute(task_of(q.text), 0, "m", 60_000), rng)
    assert isinstance(done, ComputeDone)
    assert duration == done.compute_ms + backend.commit_ms  # the executor pays the commitment
    total = q.prompt_tokens + done.tokens
    assert backend.commit_ms == max(1, int(commit_ms(done.compute_ms, total) if layer_states
                                           else prefill_ms(total, DEVICE.tokens_per_s)))
    return backend, done, q.prompt_tokens


def test_committing_costs_the_capture_and_the_hashing_not_a_prefill() -> None:
    backend, done, prompt = committed("")
    state_bytes = MODEL_LAYERS * (prompt + done.tokens) * HIDDEN_SIZE * 4
    assert done.compute_ms * 0.01 < backend.commit_ms < done.compute_ms * 0.05 + (
        state_bytes / 100_000)
    assert backend.commit_ms < committed("", layer_states=False)[0].commit_ms


def check_of(done: ComputeDone, backend: CommittingCost, layers: tuple[int, ...]) -> StartCheck:
    question = next(iter(backend.cost.by_text))
    return StartCheck(check_id=b"c", task=task_of(question), model_hash=model_hash("m"),
                      output_ids=done.output_ids, answer=done.answer, cot=done.cot,
                      chunk_tokens=32, chunk_indices=(1, 3), fingerprints=done.fingerprints[1:4:2],
                      deadline_at_ms=0, executor="e", attempt=0, states_root=done.states_root,
                      state_layers=done.state_layers, layers=layers)


def test_a_layer_check_fetches_the_daemons_leaves_and_costs_a_fraction_of_a_prefill() -> None:
    backend, done, prompt = committed("")
    assert done.state_layers == MODEL_LAYERS and len(done.states_root) == 32
    checks = CheckCost(DEVICE.tokens_per_s, backend)
    work = checks.work(check_of(done, backend, (7, 19)))
    plan = plan_check(prompt, len(done.output_ids), (1, 3), 32, (7, 19))
    total = prompt + len(done.output_ids)
    leaf = [LEAF_HEADER_BYTES + 4 * HIDDEN_SIZE * min(BLOCK_TOKENS, total - b * BLOCK_TOKENS)
            for _, b in needed_leaves(plan)]
    assert work.passed and work.fetch_bytes == sum(leaf)
    whole_prefill = prefill_ms(total, DEVICE.tokens_per_s)
    assert 0 < work.compute_ms < whole_prefill * 3 / MODEL_LAYERS


@pytest.mark.parametrize(("cheat", "passes"), [("", True), ("swap", False),
                                               ("fabricate:1.0", False), ("fabricate:0.0", True)])
def test_a_check_fails_when_a_layer_it_reruns_was_faked(cheat: str, passes: bool) -> None:
    backend, done, _ = committed(cheat)
    work = CheckCost(DEVICE.tokens_per_s, backend).work(check_of(done, backend, (2, 30)))
    assert work.passed is passes


def test_without_layer_states_the_check_reprefills_the_sampled_chunks() -> None:
    backend, done, _ = committed("swap", layer_states=False)
    assert done.states_root == b"" and done.state_layers == 0
    work = CheckCost(DEVICE.tokens_per_s, backend).work(check_of(done, backend, ()))
    assert not work.passed and work.fetch_bytes == 0
    assert work.compute_ms == int(prefill_ms(2 * 32, DEVICE.tokens_per_s))
