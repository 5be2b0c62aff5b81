"""Requester side of verification, the checking half: ask verifiers, take their verdicts,
decide, and apply the consequences.

``VerdictChecks`` sits between ``CommitRevealAuction`` (protocol/verification/commits.py) and
``VerifiedAuction`` (protocol/verification/requester.py, which documents the promises, holds a
sampled result here and sets the attributes declared below). For a held result it promises:

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
from protocol.envelopes import PENALTY_FORGED, Unopened, open_authored, seal
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind
from protocol.machine import Effect, Emit, Send
from protocol.market.state import Attempt, AttemptState, OpenTask
from protocol.verification.commits import CommitRevealAuction
from protocol.verification.messages import (
    CHECK_DOMAIN,
    VERDICT_DOMAIN,
    CheckBody,
    CheckRequest,
    Verdict,
    VerdictBody,
    VerdictStatus,
)
from protocol.verification.rules import Decision, check_id, decide, encode_proof
from protocol.verification.state import Check, CheckPhase, move_check, status_of

PENALTY_BAD_VERDICT = 10


class VerdictChecks(CommitRevealAuction):
    """The checking half of ``VerifiedAuction`` (see the module docstring)."""

    #: ledger peers that may verify a result of this model hash, at ``now``
    verifier_candidates: Callable[[bytes, int], Sequence[str]]
    #: whether the ledger shows ``peer`` failing, at ``now``
    excluded: Callable[[str, int], bool]
    checks: dict[tuple[bytes, int], Check]
    #: peers we convicted -> until when we exclude them
    exclusions: dict[str, int]

    def is_excluded(self, peer: str, now: int) -> bool:
        until = self.exclusions.get(peer)
        return (until is not None and now < until) or self.excluded(peer, now)

    def _set_status(self, check: Check, now: int) -> None:
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
            if self.is_excluded(verifier, now):
                continue
            cid = check_id(check.task_id, check.attempt, verifier, round_)
            body = CheckBody(
                check_id=cid, requester=self.peer, verifier=verifier, task=task.spec,
                commit=check.commit.envelope, nonce=self.vtasks[check.task_id].nonce,
                batch=tuple(sorted(self.vtasks[check.task_id].commits[a].hash
                                   for a in check.commit.batch.attempts)),
                answer=check.result.body.answer, cot=check.result.body.cot, salt=reveal.salt,
                output_ids=reveal.output_ids, chunk_indices=check.chunks,
                fingerprints=tuple(fingerprints[i] for i in check.chunks),
                proofs=tuple(encode_proof(merkle_proof(fingerprints, i)) for i in check.chunks),
                round=round_, timeout_ms=self.verify.check_timeout_ms,
            )
            check.outstanding[verifier] = (cid, now + self.verify.check_timeout_ms)
            n -= 1
            self._count("check_requests_sent")
            effects.append(Send(verifier, CheckRequest(envelope=seal(self.identity, CHECK_DOMAIN,
                                                                     body))))
        return effects

    def _on_verdict(self, peer: str, msg: Verdict, now: int) -> list[Effect]:
        reject = self._rejecter("verify", "verdict", peer)

        try:
            body = open_authored(msg.envelope, VERDICT_DOMAIN, VerdictBody,
                                 self.config.max_frame, sender=peer, author=lambda b: b.verifier)
        except Unopened as refused:
            return reject(refused.why, PENALTY_FORGED)
        check = self.checks.get((body.task_id, body.attempt))
        task = self.tasks.get(body.task_id)
        wanted = check.outstanding.get(peer) if check is not None else None
        if check is None or task is None or wanted is None or wanted[0] != body.check_id:
            return reject("unsolicited")
        del check.outstanding[peer]
        effects: list[Effect] = []
        if body.status is VerdictStatus.DECLINED:
            check.outcomes[peer] = "declined"
            self._count("verdicts_declined")
            effects += self._ask(task, check, 1, now)
        elif (body.executor, body.requester) != (check.executor, self.peer) \
                or body.evidence_hash != check.evidence or body.chunk_indices != check.chunks:
            check.outcomes[peer] = "invalid"
            effects += reject("inconsistent", PENALTY_BAD_VERDICT)
            effects += self._ask(task, check, 1, now)
        else:
            passed = body.status is VerdictStatus.PASS
            check.rounds[-1][peer] = passed
            check.outcomes[peer] = body.status.value
            self._count(f"verdicts.{body.status.value}")
            effects.append(Emit("verify.verdict", {"task_id": body.task_id.hex(),
                                                   "executor": check.executor, "verifier": peer,
                                                   "status": body.status.value}))
        if not check.outstanding:
            effects += self._judge(task, check, now)
        return effects + [self._updated(task)]

    def _judge(self, task: OpenTask, check: Check, now: int) -> list[Effect]:
        decision = decide(check.rounds, self.verify.max_escalations)
        if decision is Decision.ESCALATE:
            check.rounds.append({})
            self._count("escalations")
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
        self._set_status(check, now)
        self._count(f"checks_{check.phase.value}")
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
            return effects + super().admit(task, check.result, now)
        if decision is Decision.FAIL:
            return effects + self._convict(task, attempt, "re-computed fingerprints differ",
                                           check.evidence, now)
        return effects + self._fail_attempt(task, attempt, "verification:undecided", None, now,
                                            cancel=False)

    def _convict(self, task: OpenTask, attempt: Attempt, why: str, evidence: bytes,
                 now: int) -> list[Effect]:
        """A failed verification: attest, exclude, and take the attempt out of the task."""
        self.exclusions[attempt.peer] = now + self.verify.exclusion_ms
        vt = self.vtasks.get(task.spec.task_id)
        if vt is not None and attempt.peer not in vt.status:
            vt.status[attempt.peer] = {"status": "failed", "attempt": attempt.attempt,
                                       "detail": why}
        self._count("convicted")
        return [
            LedgerAttest(subject=attempt.peer, object_id=task.spec.task_id,
                         kind=AttestationKind.VERIFICATION_FAILED, outcome=why[:128],
                         evidence_hash=evidence),
            Emit("verify.failed", {"task_id": task.spec.task_id.hex(), "peer": attempt.peer,
                                   "why": why}),
            *self._fail_attempt(task, attempt, f"verification:{why}", None, now, cancel=False),
        ]
