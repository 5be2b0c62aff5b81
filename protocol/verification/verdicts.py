"""Requester side of verification, the checking component: sample, ask verifiers, take their
verdicts, decide, and apply the consequences.

``VerdictChecks`` is held by ``VerifiedAuction`` (protocol/verification/requester.py, which
documents the promises and owns the records: the per-task ``vtasks``, the ``checks`` in flight
and the ``Exclusions``); it calls the ``Auction`` it is given to admit a result to the vote or
fail an attempt. ``admit`` is the seam for a revealed result that passed the market's checks:
it is held for checking with probability ``sample_rate`` (drawn from the seed), else admitted
unchecked. For a held result it promises:

* verifiers are asked in the seed's ranking order, skipping excluded peers, ``n`` at a time,
  each with a signed ``CheckRequest`` carrying the commitment, the reveal and the sampled
  chunks' fingerprints with their Merkle proofs, and ``check_timeout_ms`` to answer;
* a ``Verdict`` counts only if it opens as signed and sent by its verifier (else penalized as
  forged), answers a request outstanding to that verifier (else "unsolicited") and names the
  check's executor, requester, evidence and chunks (else penalized as inconsistent and the
  next verifier asked); a declined one is replaced by the next in the ranking;
* the decision is ``protocol.verification.rules.decide`` over the rounds: ESCALATE asks a
  panel of ``panel`` more; PASS admits the result to the vote; FAIL convicts the executor
  (attested ``VERIFICATION_FAILED``, excluded for ``exclusion_ms``, the attempt failed and
  replanned); UNDECIDED fails the attempt without blame. Every verifier contradicted by a PASS
  or FAIL is attested ``VERDICT_CONTRADICTED``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from crypto.merkle import merkle_proof
from protocol.envelopes import seal
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind
from protocol.machine import Effect, Emit, Send
from protocol.market.auction import Auction
from protocol.market.events import TaskUpdated
from protocol.market.refusals import count, opened, rejecter
from protocol.market.state import Attempt, AttemptState, OpenTask, ResultInfo, snapshot
from protocol.verification.messages import (
    CHECK_DOMAIN,
    VERDICT_DOMAIN,
    CheckBody,
    CheckRequest,
    Verdict,
    VerdictBody,
    VerdictStatus,
)
from protocol.verification.rules import (
    Decision,
    check_id,
    choose_chunks,
    decide,
    encode_proof,
    evidence_hash,
    rank_verifiers,
    sampled,
)
from protocol.verification.state import (
    Check,
    CheckPhase,
    CommitInfo,
    Exclusions,
    VerifyConfig,
    VerifyTask,
    move_check,
    status_of,
)

PENALTY_BAD_VERDICT = 10


class VerdictChecks:
    """Sampled checks of revealed results for the ``VerifiedAuction`` that holds it."""

    def __init__(self, auction: Auction, verify: VerifyConfig,
                 verifier_candidates: Callable[[bytes, int], Sequence[str]],
                 exclusions: Exclusions, vtasks: dict[bytes, VerifyTask],
                 checks: dict[tuple[bytes, int], Check]) -> None:
        self.auction = auction
        self.verify = verify
        #: ledger peers that may verify a result of this model hash, at ``now``
        self.verifier_candidates = verifier_candidates
        self.exclusions = exclusions
        self.vtasks = vtasks
        self.checks = checks

    def admit(self, task: OpenTask, result: ResultInfo, info: CommitInfo,
              now: int) -> list[Effect]:
        """Hold a sampled result for checking; admit the rest to the vote."""
        key = (task.spec.task_id, result.attempt)
        vt = self.vtasks.get(task.spec.task_id)
        executor = result.body.executor
        if vt is None:
            return self.auction.admit(task, result, now)
        seed = info.batch.seed

        def unchecked(status: str) -> list[Effect]:
            vt.status[executor] = {"status": status, "attempt": result.attempt,
                                   "sampled": status != "not_sampled"}
            count(self.auction.counters, f"results_unchecked.{status}")
            return self.auction.admit(task, result, now)

        if not sampled(seed, executor, self.verify.sample_rate):
            return unchecked("not_sampled")
        if info.body.chunks == 0:
            return unchecked("nothing_to_check")
        ranking = rank_verifiers(seed, self.verifier_candidates(info.body.model_hash, now),
                                 exclude=(executor, self.auction.peer))
        if not ranking:
            return unchecked("no_verifier")
        chunks = choose_chunks(seed, executor, info.body.chunks, self.verify.chunks_per_check)
        check = Check(task_id=task.spec.task_id, attempt=result.attempt, executor=executor,
                      result=result, commit=info, seed=seed, chunks=chunks,
                      evidence=evidence_hash(info.hash, seed, chunks, info.reveal.output_ids
                                             if info.reveal else b""),
                      ranking=ranking, started_at_ms=now)
        self.checks[key] = check
        # held: the attempt stays running (so no replan) until the task's deadline at most
        task.attempts[result.attempt].due_at_ms = task.deadline_at_ms
        count(self.auction.counters, "checks_started")
        effects: list[Effect] = [Emit("verify.check_started", {
            "task_id": task.spec.task_id.hex(), "executor": executor, "chunks": list(chunks)})]
        effects += self._ask(task, check, self.verify.verifiers, now)
        if not check.outstanding:
            effects += self._judge(task, check, now)
        return effects + [TaskUpdated(snapshot(task))]

    def set_status(self, check: Check, now: int) -> None:
        vt = self.vtasks.get(check.task_id)
        if vt is not None:
            vt.status[check.executor] = status_of(check, now)

    def _ask(self, task: OpenTask, check: Check, n: int, now: int) -> list[Effect]:
        """Ask the next ``n`` verifiers of the ranking for the current round."""
        effects: list[Effect] = []
        reveal = check.commit.reveal
        assert reveal is not None  # a check is only made from a revealed result
        fingerprints = check.result.body.fingerprints
        round_ = len(check.rounds) - 1
        while n > 0 and check.next_rank < len(check.ranking):
            verifier = check.ranking[check.next_rank]
            check.next_rank += 1
            if self.exclusions.is_excluded(verifier, now):
                continue
            cid = check_id(check.task_id, check.attempt, verifier, round_)
            body = CheckBody(
                check_id=cid, requester=self.auction.peer, verifier=verifier, task=task.spec,
                commit=check.commit.envelope, nonce=self.vtasks[check.task_id].nonce,
                batch=tuple(sorted(self.vtasks[check.task_id].commits[a].hash
                                   for a in check.commit.batch.attempts)),
                answer=check.result.body.answer, cot=check.result.body.cot, salt=reveal.salt,
                output_ids=reveal.output_ids, chunk_indices=check.chunks,
                fingerprints=tuple(fingerprints[i] for i in check.chunks),
                proofs=tuple(encode_proof(merkle_proof(fingerprints, i)) for i in check.chunks),
                round=round_, timeout_ms=self.verify.check_timeout_ms,
                system_prompt=check.result.body.system_prompt,
                tool_calls=check.result.body.tool_calls, adapter=check.result.body.adapter,
            )
            check.outstanding[verifier] = (cid, now + self.verify.check_timeout_ms)
            n -= 1
            count(self.auction.counters, "check_requests_sent")
            effects.append(Send(verifier, CheckRequest(
                envelope=seal(self.auction.identity, CHECK_DOMAIN, body))))
        return effects

    def on_verdict(self, peer: str, msg: Verdict, now: int) -> list[Effect]:
        reject = rejecter(self.auction.counters, "verify", "verdict", peer)
        body = opened(msg.envelope, VERDICT_DOMAIN, VerdictBody, self.auction.config.max_frame,
                      peer, lambda b: b.verifier, reject)
        if isinstance(body, list):
            return body
        check = self.checks.get((body.task_id, body.attempt))
        task = self.auction.tasks.get(body.task_id)
        wanted = check.outstanding.get(peer) if check is not None else None
        if check is None or task is None or wanted is None or wanted[0] != body.check_id:
            return reject("unsolicited")
        del check.outstanding[peer]
        effects: list[Effect] = []
        if body.status is VerdictStatus.DECLINED:
            check.outcomes[peer] = "declined"
            count(self.auction.counters, "verdicts_declined")
            effects += self._ask(task, check, 1, now)
        elif (body.executor, body.requester) != (check.executor, self.auction.peer) \
                or body.evidence_hash != check.evidence or body.chunk_indices != check.chunks:
            check.outcomes[peer] = "invalid"
            effects += reject("inconsistent", PENALTY_BAD_VERDICT)
            effects += self._ask(task, check, 1, now)
        else:
            passed = body.status is VerdictStatus.PASS
            check.rounds[-1][peer] = passed
            check.outcomes[peer] = body.status.value
            count(self.auction.counters, f"verdicts.{body.status.value}")
            effects.append(Emit("verify.verdict", {"task_id": body.task_id.hex(),
                                                   "executor": check.executor, "verifier": peer,
                                                   "status": body.status.value}))
        if not check.outstanding:
            effects += self._judge(task, check, now)
        return effects + [TaskUpdated(snapshot(task))]

    def _judge(self, task: OpenTask, check: Check, now: int) -> list[Effect]:
        decision = decide(check.rounds, self.verify.max_escalations)
        if decision is Decision.ESCALATE:
            check.rounds.append({})
            count(self.auction.counters, "escalations")
            effects: list[Effect] = [Emit("verify.escalated", {
                "task_id": check.task_id.hex(), "executor": check.executor,
                "round": len(check.rounds) - 1})]
            effects += self._ask(task, check, self.verify.panel, now)
            if check.outstanding:
                return effects
            decision = Decision.UNDECIDED
        else:
            effects = []
        key = (check.task_id, check.attempt)
        del self.checks[key]
        attempt = task.attempts[check.attempt]
        move_check(check, {Decision.PASS: CheckPhase.PASSED, Decision.FAIL: CheckPhase.FAILED}
                   .get(decision, CheckPhase.UNDECIDED))
        self.set_status(check, now)
        count(self.auction.counters, f"checks_{check.phase.value}")
        effects.append(Emit("verify.decided", {
            "task_id": check.task_id.hex(), "executor": check.executor,
            "decision": check.phase.value, "rounds": len(check.rounds),
            "elapsed_ms": now - check.started_at_ms}))
        if decision in (Decision.PASS, Decision.FAIL):
            passed = decision is Decision.PASS
            for rnd in check.rounds:
                for verifier, said in rnd.items():
                    if said != passed:
                        effects.append(LedgerAttest(
                            subject=verifier, object_id=check.task_id,
                            kind=AttestationKind.VERDICT_CONTRADICTED,
                            outcome=f"said {'pass' if said else 'fail'}, decided "
                                    f"{decision.value}", evidence_hash=check.evidence))
        if attempt.state is not AttemptState.ASSIGNED or task.finished:
            return effects
        if decision is Decision.PASS:
            return effects + self.auction.admit(task, check.result, now)
        if decision is Decision.FAIL:
            return effects + self.convict(task, attempt, "re-computed fingerprints differ",
                                          check.evidence, now)
        return effects + self.auction.fail_attempt(task, attempt, "verification:undecided", None,
                                                   now, cancel=False)

    def convict(self, task: OpenTask, attempt: Attempt, why: str, evidence: bytes,
                now: int) -> list[Effect]:
        """A failed verification: attest, exclude, and take the attempt out of the task."""
        self.exclusions.convict(attempt.peer, now)
        vt = self.vtasks.get(task.spec.task_id)
        if vt is not None and attempt.peer not in vt.status:
            vt.status[attempt.peer] = {"status": "failed", "attempt": attempt.attempt,
                                       "detail": why}
        count(self.auction.counters, "convicted")
        return [
            LedgerAttest(subject=attempt.peer, object_id=task.spec.task_id,
                         kind=AttestationKind.VERIFICATION_FAILED, outcome=why[:128],
                         evidence_hash=evidence),
            Emit("verify.failed", {"task_id": task.spec.task_id.hex(), "peer": attempt.peer,
                                   "why": why}),
            *self.auction.fail_attempt(task, attempt, f"verification:{why}", None, now,
                                       cancel=False),
        ]

    def on_tick(self, now: int) -> list[Effect]:
        """Replace every verifier whose verdict is overdue; judge a round left with none."""
        effects: list[Effect] = []
        for check in list(self.checks.values()):
            task = self.auction.tasks.get(check.task_id)
            if task is None or task.finished or check.phase is not CheckPhase.CHECKING:
                continue
            late = [v for v, (_, due) in check.outstanding.items() if now >= due]
            for verifier in late:
                del check.outstanding[verifier]
                check.outcomes[verifier] = "timeout"
                count(self.auction.counters, "verdicts_timed_out")
                effects += self._ask(task, check, 1, now)
            if late and not check.outstanding:
                effects += self._judge(task, check, now)
            if late:
                effects.append(TaskUpdated(snapshot(task)))
        return effects
