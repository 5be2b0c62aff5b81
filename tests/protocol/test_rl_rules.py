"""Rollout-job messages, prompt derivation, group validation and the capacity rule."""

from __future__ import annotations

import math
from dataclasses import replace

import msgpack
import pytest

from crypto.keys import Identity
from protocol.codec import decode, encode
from protocol.envelopes import open_authored, seal
from protocol.errors import InvalidMessage
from protocol.rl.capacity import CapacityInputs, min_staleness, plan
from protocol.rl.messages import (
    MAX_RESULT_TOKENS,
    RL_RESULT_DOMAIN,
    Completion,
    RolloutBeaconBody,
    RolloutReject,
    RolloutRejectReason,
    RolloutResult,
    RolloutResultBody,
    RolloutSampling,
)
from protocol.rl.prompts import job_prompts, prompt_indices
from protocol.rl.validation import check_group
from tests.protocol.rl_fixtures import VOCAB, honest_result, make_job, with_completion


def test_job_and_result_round_trip_through_a_signed_envelope() -> None:
    worker = Identity.generate()
    job = make_job()
    beacon = RolloutBeaconBody(job=job, round=0, max_price=1.0, bid_window_ms=500,
                               deadline_ms=60_000)
    assert decode(encode(beacon), RolloutBeaconBody) == beacon
    body = replace(honest_result(job), worker=worker.peer_id)
    wire = encode(RolloutResult(envelope=seal(worker, RL_RESULT_DOMAIN, body)))
    got = decode(wire, RolloutResult)
    opened = open_authored(got.envelope, RL_RESULT_DOMAIN, RolloutResultBody, 1 << 20,
                           sender=worker.peer_id, author=lambda b: b.worker)
    assert opened == body
    reject = RolloutReject(job_id=job.job_id, attempt=1,
                           reason=RolloutRejectReason.OTHER_VERSION, detail="holds 2")
    assert decode(encode(reject), RolloutReject) == reject


def _raw_completion(tokens: list[object], logprobs: list[object]) -> bytes:
    return msgpack.packb([Completion.TAG, Completion.VERSION, tokens, logprobs, True])


@pytest.mark.parametrize(
    ("tokens", "logprobs", "what"),
    [
        ([1, 2], [-0.1], "tokens but"),  # lengths differ
        ([1, 2], [-0.1, 0.5], "outside"),  # a positive log-prob
        ([1, 2], [-0.1, float("nan")], "not finite"),
        ([1, 2], [-0.1, -1e6], "outside"),  # below MIN_LOGPROB
        ([1, -2], [-0.1, -0.2], "outside"),  # a negative token id
        ([1, True], [-0.1, -0.2], "expected an int"),
        ([1, 2], [-0.1, -1], "expected a float"),
    ],
)
def test_completion_decoding_is_strict(tokens: list[object], logprobs: list[object],
                                       what: str) -> None:
    with pytest.raises(InvalidMessage, match=what):
        decode(_raw_completion(tokens, logprobs), Completion)


def test_job_bounds_are_checked_on_decode() -> None:
    too_big = make_job(prompts=16, group_size=64,
                       sampling=RolloutSampling(temperature=1.0, top_p=1.0, max_tokens=64))
    with pytest.raises(InvalidMessage, match="exceeds"):
        decode(encode(too_big), type(too_big))
    with pytest.raises(InvalidMessage, match="prompts from a dataset"):
        decode(encode(make_job(prompts=5, dataset_size=4)), type(too_big))
    with pytest.raises(InvalidMessage, match="top_p"):
        decode(encode(RolloutSampling(temperature=1.0, top_p=0.0, max_tokens=4)),
               RolloutSampling)
    assert 16 * 64 * 32 <= MAX_RESULT_TOKENS


def test_prompt_indices_are_distinct_deterministic_and_seed_dependent() -> None:
    a = prompt_indices(5, 8, 50)
    assert a == prompt_indices(5, 8, 50)
    assert len(set(a)) == 8 and all(0 <= i < 50 for i in a)
    assert a != prompt_indices(6, 8, 50)
    assert sorted(prompt_indices(9, 16, 16)) == list(range(16))
    with pytest.raises(ValueError, match="count"):
        prompt_indices(1, 5, 4)


def test_an_honest_group_passes() -> None:
    job = make_job()
    assert check_group(job, honest_result(job), vocab_size=VOCAB) is None


CUT = Completion(token_ids=(1, 2, 3), logprobs=(-1.0, -1.0, -1.0), finished=False)


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        (lambda j, r: replace(r, job_id=bytes(32)), "another job"),
        (lambda j, r: replace(r, policy_version=2), "version 2"),
        (lambda j, r: replace(r, prompt_indices=(0, 1)), "prompt indices"),
        (lambda j, r: replace(r, completions=r.completions[:-1]), "7 completions"),
        (lambda j, r: with_completion(r, 2, Completion(token_ids=(1, VOCAB), logprobs=(
            -1.0, -1.0), finished=True)), "vocabulary"),
        (lambda j, r: with_completion(r, 0, Completion(token_ids=(), logprobs=(),
                                                       finished=True)), "empty"),
        (lambda j, r: with_completion(r, 1, CUT), "not at max_tokens"),
        (lambda j, r: with_completion(r, 3, Completion(token_ids=(1,) * 9,
                                                       logprobs=(-1.0,) * 9, finished=True)),
         "exceed max_tokens"),
        (lambda j, r: with_completion(r, 4, Completion(token_ids=(1, 2), logprobs=(
            -1.0, 0.5), finished=True)), "log-prob"),
        (lambda j, r: with_completion(r, 5, Completion(token_ids=(1, 2), logprobs=(
            -1.0, math.inf), finished=True)), "log-prob"),
        (lambda j, r: replace(r, commitment=b"\x02" * 32), "commitment does not open"),
        (lambda j, r: replace(r, commitment=b""), "commitment does not open"),
        (lambda j, r: replace(r, completions=(replace(r.completions[0], fingerprint=b"\x02\x02"),
                                              *r.completions[1:])), "commitment does not open"),
    ],
)
def test_a_tampered_group_fails_with_a_reason(tamper: object, why: str) -> None:
    job = make_job()
    bad = tamper(job, honest_result(job))  # type: ignore[operator]
    reason = check_group(job, bad, vocab_size=VOCAB)
    assert reason is not None and why in reason


def test_prompts_chosen_by_the_seed_not_the_worker() -> None:
    job = make_job()
    easy = tuple(reversed(job_prompts(job)))
    assert check_group(job, replace(honest_result(job), prompt_indices=easy),
                       vocab_size=VOCAB) == "prompt indices do not match the job's seed"


def test_capacity_rule_figures() -> None:
    # 8 workers at 0.5 rollouts/s give 4/s; the learner wants 32 per 4 s step = 8/s
    p = plan(CapacityInputs(workers=8, rollouts_per_s=0.5, batch=32, step_s=4.0,
                            dissemination_s=3.0, generation_s=6.0, staleness=2))
    assert (p.supply_per_s, p.demand_per_s, p.throughput_ok) == (4.0, 8.0, False)
    assert p.min_workers == 16 and p.busy_bound == 0.5
    assert p.min_staleness == 3 and not p.staleness_ok and not p.holds
    ok = plan(CapacityInputs(workers=16, rollouts_per_s=0.5, batch=32, step_s=4.0,
                             dissemination_s=2.0, generation_s=6.0, staleness=2))
    assert ok.throughput_ok and ok.min_staleness == 2 and ok.holds and ok.busy_bound == 1.0


def test_min_staleness_at_exact_multiples_and_zero() -> None:
    assert min_staleness(0.0, 0.0, 1.0) == 0
    assert min_staleness(0.1 + 0.2, 0.7, 0.5) == 2  # 1.0000000000000002 / 0.5
    assert min_staleness(1.0, 0.01, 1.0) == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("workers", -1), ("batch", 0), ("rollouts_per_s", 0.0), ("step_s", math.nan),
     ("dissemination_s", -1.0), ("staleness", -2), ("generation_s", math.inf)],
)
def test_capacity_rule_names_bad_input(field: str, value: object) -> None:
    inputs = CapacityInputs(workers=4, rollouts_per_s=1.0, batch=8, step_s=2.0,
                            dissemination_s=1.0, generation_s=1.0)
    with pytest.raises(ValueError, match=field):
        plan(replace(inputs, **{field: value}))


def test_rollouts_in_flight_rule() -> None:
    from protocol.rl.capacity import rollouts_in_flight

    assert rollouts_in_flight(64, 0, 30.0, 10.0) == 64  # synchronous: one batch
    assert rollouts_in_flight(64, 8, 25.0, 10.0) == 4 * 64  # ceil(2.5) + 1 batches
    assert rollouts_in_flight(64, 1, 25.0, 10.0) == 2 * 64  # capped by S
    assert rollouts_in_flight(64, 4, 20.0, 10.0) == 3 * 64  # an exact multiple
    with pytest.raises(ValueError, match="turnaround_s"):
        rollouts_in_flight(64, 1, -1.0, 10.0)


def test_jobs_per_worker_rule() -> None:
    from protocol.rl.capacity import DEFAULT_JOBS_PER_WORKER, jobs_per_worker

    assert jobs_per_worker(None, 3.0) == jobs_per_worker(6.0, None) == DEFAULT_JOBS_PER_WORKER
    assert jobs_per_worker(6.0, 9.0) == 2  # a job outlasts a step: the next one, queued
    assert jobs_per_worker(6.0, 2.5) == 4  # ceil(2.4) jobs finish within a step, plus one
    assert jobs_per_worker(6.0, 2.0) == 4  # an exact multiple: 3 finish, plus one
    assert jobs_per_worker(0.3, 5.0) == 2  # steps that skip every group
    with pytest.raises(ValueError, match="generation_s"):
        jobs_per_worker(6.0, 0.0)
    with pytest.raises(ValueError, match="step_s"):
        jobs_per_worker(-1.0, 2.0)
