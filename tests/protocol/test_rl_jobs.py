"""The learner's job book: accept, stale, invalid (attest, exclude, reissue), timeouts."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest

from protocol.errors import LocalProtocolError
from protocol.ledger.records import AttestationKind
from protocol.market.attestations import ledger_attestation
from protocol.rl.jobs import (
    ACCEPTED,
    EXCLUDED,
    INVALID,
    STALE,
    UNKNOWN,
    BookConfig,
    JobBook,
)
from protocol.rl.messages import RolloutJob, RolloutResultBody, RolloutSampling
from tests.protocol.rl_fixtures import VOCAB, honest_result


def book(staleness: int = 0, checks: tuple = ()) -> JobBook:  # type: ignore[type-arg]
    config = BookConfig(learner="learner", model="m", dataset_size=50, vocab_size=VOCAB,
                        prompts_per_job=2, group_size=4, max_staleness=staleness,
                        sampling=RolloutSampling(temperature=1.0, top_p=1.0, max_tokens=8),
                        job_ms=10_000)
    return JobBook(config, Random(7), checks)


def running(b: JobBook, worker: str, now: int = 0, due: int = 5_000) -> RolloutJob:
    job = b.new_job(now)
    b.assign(job.job_id, worker, now, due)
    return job


def test_an_honest_current_group_is_accepted_and_attested_completed() -> None:
    b = book()
    job = running(b, "w1")
    v = b.receive(honest_result(job, "w1"), "w1", 100)
    assert v.outcome == ACCEPTED and v.attest is not None
    assert ledger_attestation(v.attest).kind is AttestationKind.TASK_COMPLETED
    assert b.in_flight() == 0 and b.counters[ACCEPTED] == 1


@pytest.mark.parametrize(("staleness", "published", "outcome"),
                         [(0, 1, STALE), (2, 2, ACCEPTED), (2, 3, STALE), (8, 8, ACCEPTED)])
def test_staleness_bound_decides(staleness: int, published: int, outcome: str) -> None:
    b = book(staleness)
    job = running(b, "w1")  # version 0
    b.publish(published)
    v = b.receive(honest_result(job, "w1"), "w1", 100)
    assert v.outcome == outcome
    assert v.attest is None if outcome == STALE else v.attest is not None
    assert b.counters[outcome] == 1


def test_a_cheater_is_attested_excluded_and_its_jobs_reissued() -> None:
    b = book()
    job = running(b, "cheat")
    other = running(b, "cheat")
    forged = replace(honest_result(job, "cheat"), prompt_indices=(0, 1))
    v = b.receive(forged, "cheat", 100)
    assert v.outcome == INVALID and "prompt indices" in v.reason
    assert v.attest is not None and ledger_attestation(v.attest).kind is AttestationKind.TASK_FAILED
    assert not b.eligible("cheat") and v.cancelled == (other.job_id,)
    assert [r.prompt_seed for r in v.reissued] == [job.prompt_seed, other.prompt_seed]
    assert all(r.job_id not in (job.job_id, other.job_id) for r in v.reissued)
    with pytest.raises(LocalProtocolError, match="excluded"):
        b.assign(v.reissued[0].job_id, "cheat", 200, 5_000)
    # its late result for the cancelled job is nobody's running job any more
    assert b.receive(honest_result(other, "cheat"), "cheat", 300).outcome == UNKNOWN


def test_extra_checks_run_after_the_model_free_ones() -> None:
    seen: list[bytes] = []

    def recompute(job: RolloutJob, result: RolloutResultBody) -> str | None:
        seen.append(job.job_id)
        return "log-probs disagree with recomputation (KL 3.2)"

    b = book(checks=(recompute,))
    job = running(b, "w1")
    v = b.receive(honest_result(job, "w1"), "w1", 10)
    assert v.outcome == INVALID and "KL" in v.reason and seen == [job.job_id]
    job2 = running(b, "w2")
    bad = replace(honest_result(job2, "w2"), policy_version=5)
    assert "version" in b.receive(bad, "w2", 10).reason and seen == [job.job_id]


def test_results_from_the_wrong_peer_or_twice_are_unknown() -> None:
    b = book()
    job = running(b, "w1")
    assert b.receive(honest_result(job, "w2"), "w2", 10).outcome == UNKNOWN
    assert b.receive(honest_result(job, "w1"), "w1", 10).outcome == ACCEPTED
    assert b.receive(honest_result(job, "w1"), "w1", 11).outcome == UNKNOWN


def test_a_worker_excluded_after_assignment_has_its_result_dropped() -> None:
    b = book()
    job = running(b, "w1")
    b.excluded.add("w1")
    v = b.receive(honest_result(job, "w1"), "w1", 10)
    assert v.outcome == EXCLUDED and len(v.reissued) == 1


def test_deadlines_reissue_and_the_learner_never_waits_past_them() -> None:
    b = book()
    job = running(b, "slow", now=0, due=5_000)
    unassigned = b.new_job(0)
    assert b.next_deadline() == 5_000
    assert b.expire(4_999) == []
    [late] = b.expire(5_000)
    assert late.outcome == "timeout" and late.attest is not None
    assert ledger_attestation(late.attest).kind is AttestationKind.TASK_TIMED_OUT
    assert late.reissued[0].prompt_seed == job.prompt_seed
    verdicts = b.expire(10_000)
    assert [v.job_id for v in verdicts] == [unassigned.job_id] and verdicts[0].attest is None
    assert b.receive(honest_result(job, "slow"), "slow", 10_001).outcome == UNKNOWN


def test_reissued_jobs_carry_the_current_version() -> None:
    b = book(staleness=1)
    job = running(b, "w1")
    b.publish(4)
    [v] = b.expire(5_000)
    assert v.reissued[0].policy_version == 4 and job.policy_version == 0
    with pytest.raises(LocalProtocolError, match="older"):
        b.publish(3)


def test_jobs_for_an_older_version_only_within_the_bound() -> None:
    b = book(staleness=2)
    b.publish(5)
    assert b.new_job(0, version=3).policy_version == 3
    with pytest.raises(LocalProtocolError, match="version 2 while training 5"):
        b.new_job(0, version=2)
    with pytest.raises(LocalProtocolError, match="version 6"):
        b.new_job(0, version=6)


def test_a_cancelled_job_is_gone_without_attestation() -> None:
    b = book()
    job = running(b, "w1")
    b.cancel(job.job_id)
    assert b.in_flight() == 0 and b.counters["cancelled"] == 1
    assert b.receive(honest_result(job, "w1"), "w1", 5).outcome == UNKNOWN
    b.cancel(job.job_id)  # twice is harmless


def test_a_later_check_convicts_an_accepted_group() -> None:
    b = book()
    job = running(b, "w1")
    other = running(b, "w1")
    assert b.receive(honest_result(job, "w1"), "w1", 10).outcome == ACCEPTED
    v = b.convict(job.job_id, "log-probs disagree with recomputation", 20)
    assert v is not None and v.outcome == INVALID and not b.eligible("w1")
    assert v.attest is not None and ledger_attestation(v.attest).kind is AttestationKind.TASK_FAILED
    assert v.cancelled == (other.job_id,)
    assert sorted(r.prompt_seed for r in v.reissued) == sorted([job.prompt_seed,
                                                                other.prompt_seed])
    assert b.convict(job.job_id, "again", 30) is None  # once


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"dataset_size": 0}, "dataset_size"),
        ({"prompts_per_job": 5, "dataset_size": 4}, "exceeds dataset_size"),
        ({"group_size": 64, "prompts_per_job": 16}, "tokens per result"),
        ({"sampling": RolloutSampling(temperature=9.0, top_p=1.0, max_tokens=8)}, "sampling"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"model": "/home/someone/models/" + "x" * 60 + ".gguf"}, "model name"),
    ],
)
def test_a_run_that_would_make_malformed_jobs_is_refused(fields: dict, what: str) -> None:  # type: ignore[type-arg]
    base = dict(learner="l", model="m", dataset_size=50, vocab_size=VOCAB,
                sampling=RolloutSampling(temperature=1.0, top_p=1.0, max_tokens=64))
    with pytest.raises(ValueError, match=what):
        BookConfig(**{**base, **fields})  # type: ignore[arg-type]
