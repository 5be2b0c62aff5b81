"""Requester side of commitment-based verification, wrapped around the task market's auction.

``VerifiedAuction`` is ``protocol.market.auction.Auction`` with commit/reveal and sampled checks in
front of its result seam (``admit``). For every task it promises:

* **Terms**: right after each ``Assign`` it sends the executor signed ``Terms`` naming
  ``H(nonce)`` for a fresh per-task nonce, so the nonce is fixed before any commitment.
* **Commit window**: a ``Commit`` is accepted only from the assigned executor of a running
  attempt, before its due time, naming our nonce hash, the hash of the task we assigned, the
  bid's model hash, and chunk/token counts that fit (an inconsistent one fails the attempt; a
  forged or malformed one is penalized). A task's window opens at its first commitment and
  closes when every running attempt has committed or after ``commit_window_ms``; running
  attempts that missed it are replaced. A plain ``Result`` (no commitment) is refused.
* **Reveal**: at the close, every committed executor gets a ``RevealRequest`` with the nonce
  and ``reveal_ms`` to answer. A ``Reveal`` that does not open its commitment exactly
  (commitment hash, model hash, fingerprint count and Merkle root, token count, task and
  attempt) is a failed result: the attempt fails, the executor is attested
  ``VERIFICATION_FAILED`` with the reveal as evidence and excluded. An early reveal (before the
  window closed) is dropped. Copying another executor's answer therefore needs it before the
  window closes, when no answer has been revealed to anyone.
* **Checks**: a revealed result passes the market's checks, then with probability
  ``sample_rate`` (drawn from the seed of protocol/verification/rules.py: nobody can steer
  it) it is held out of the vote while the seed-ranked verifiers (ledger peers with the
  verifier role serving the same model hash, never the executor nor us) re-check
  ``chunks_per_check`` seed-chosen chunks; a verifier that declines or times out is replaced
  by the next in the ranking. The escalation rule is ``verification_rules.decide``; a round
  in which nobody returned a verdict (all declined, timed out or answered inconsistently) is
  UNDECIDED, so making verifiers fail cannot smuggle a sampled result into the vote.
* **Consequences**: PASS admits the result to the vote. FAIL fails the attempt (replanned,
  selector reward 0), attests the executor ``VERIFICATION_FAILED`` with the evidence hash and
  excludes it from our selections for ``exclusion_ms`` (and, through the ``excluded``
  callback, anyone the ledger shows failing). UNDECIDED fails the attempt without blame
  (replanned; nobody attested). Every verifier contradicted by a decision is attested
  ``VERDICT_CONTRADICTED``. Results not sampled, or with no verifier available, are admitted
  unchecked, and their status says so.

The commit and reveal half lives in protocol/verification/commits.py (``CommitRevealAuction``);
asking verifiers, taking their verdicts, deciding and the consequences in
protocol/verification/verdicts.py (``VerdictChecks``, built on it and this class's base); the
sampling seam, the Terms and the task statuses are here.

Own effects besides the auction's: ``protocol.ledger.events.Attest`` (a verification
attestation for the ledger, performed by the node). Task snapshots gain a ``verification`` map
(executor -> status, see protocol/verification/state.py) and ``results[i]["verification"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from random import Random

from crypto.keys import Identity
from protocol.codec import decode
from protocol.envelopes import seal
from protocol.machine import Effect, Emit, Received, Send, Tick
from protocol.market.events import AuctionConfig, TaskUpdated
from protocol.market.messages import Assign, AssignBody, Result
from protocol.market.selection import Selector
from protocol.market.state import (
    BidInfo,
    OpenTask,
    ResultInfo,
    TaskSnapshot,
)
from protocol.verification.messages import (
    TERMS_DOMAIN,
    Commit,
    Reveal,
    Terms,
    TermsBody,
    Verdict,
)
from protocol.verification.rules import (
    choose_chunks,
    evidence_hash,
    rank_verifiers,
    sampled,
)
from protocol.verification.state import (
    Check,
    CheckPhase,
    VerifyConfig,
    move_check,
    status_of,
)
from protocol.verification.verdicts import VerdictChecks

__all__ = ["VerifiedAuction", "VerifyConfig"]



class VerifiedAuction(VerdictChecks):
    def __init__(
        self,
        identity: Identity,
        selector: Selector,
        rng: Random,
        config: AuctionConfig | None = None,
        reputation: Callable[[str], float] = lambda peer: 0.5,
        *,
        verify: VerifyConfig | None = None,
        verifier_candidates: Callable[[bytes, int], Sequence[str]] = lambda h, now: (),
        excluded: Callable[[str, int], bool] = lambda peer, now: False,
    ) -> None:
        super().__init__(identity, selector, rng, config, reputation, verify=verify)
        self.verifier_candidates = verifier_candidates
        self.excluded = excluded
        self.checks: dict[tuple[bytes, int], Check] = {}
        self.exclusions: dict[str, int] = {}

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            msg = event.message
            if isinstance(msg, Commit):
                effects = self._on_commit(event.peer, msg, now)
            elif isinstance(msg, Reveal):
                effects = self._on_reveal(event.peer, msg, now)
            elif isinstance(msg, Verdict):
                effects = self._on_verdict(event.peer, msg, now)
            elif isinstance(msg, Result):
                self._count("results_rejected.uncommitted")
                effects = [Emit("task.result_rejected", {"peer": event.peer,
                                                         "why": "uncommitted"})]
            else:
                effects = super().handle(event, now)
        else:
            effects = super().handle(event, now)
            if isinstance(event, Tick):
                effects += self._on_verify_tick(now)
        return self._dress(effects, now)

    def next_deadline(self) -> int | None:
        times = [t for t in (super().next_deadline(),) if t is not None]
        for vt in self.vtasks.values():
            if vt.open_batch is not None:
                times.append(vt.open_batch.closes_at_ms)
        for check in self.checks.values():
            times.extend(due for _, due in check.outstanding.values())
        return min(times) if times else None

    # ------------------------------------------------------------------ wrapping the auction

    def _pick(self, task: OpenTask, pool: dict[str, BidInfo], now: int) -> list[Effect]:
        for peer in [p for p in pool if self.is_excluded(p, now)]:
            del pool[peer]
            self._count("bids_excluded")
        return super()._pick(task, pool, now)

    def _dress(self, effects: list[Effect], now: int) -> list[Effect]:
        """Send Terms after each Assign; add verification statuses to snapshots; clean up."""
        out: list[Effect] = []
        for e in effects:
            if isinstance(e, TaskUpdated):
                out.append(self._with_status(e.snapshot, now))
                continue
            out.append(e)
            if isinstance(e, Send) and isinstance(e.message, Assign):
                body = decode(e.message.envelope.payload, AssignBody)  # signed by us just now
                vt = self._vtask(body.task.task_id)
                terms = TermsBody(task_id=body.task.task_id, attempt=body.attempt,
                                  requester=self.peer, executor=body.executor,
                                  nonce_hash=vt.nonce_hash)
                out.append(Send(e.peer, Terms(envelope=seal(self.identity, TERMS_DOMAIN,
                                                            terms))))
        for key, check in list(self.checks.items()):
            task = self.tasks.get(key[0])
            if task is None or task.finished:
                move_check(check, CheckPhase.ABANDONED)
                self._set_status(check, now)
                del self.checks[key]
                self._count("checks_abandoned")
        for task_id in [t for t in self.vtasks if t not in self.tasks]:
            del self.vtasks[task_id]
        return out

    def _with_status(self, snap: TaskSnapshot, now: int) -> TaskUpdated:
        vt = self.vtasks.get(bytes.fromhex(snap.task_id))
        if vt is None:
            return TaskUpdated(snap)
        status = {peer: dict(s) for peer, s in vt.status.items()}
        for check in self.checks.values():
            if check.task_id.hex() == snap.task_id:
                status[check.executor] = status_of(check, now)
        data = dict(snap.data)
        data["verification"] = status
        results = data.get("results")
        if isinstance(results, list):
            data["results"] = [
                {**r, "verification": status.get(str(r.get("executor")), {}).get("status")}
                if isinstance(r, dict) else r for r in results]
        return TaskUpdated(TaskSnapshot(data))

    # ------------------------------------------------------------------ the seam

    def admit(self, task: OpenTask, result: ResultInfo, now: int) -> list[Effect]:
        """Hold a sampled result for checking; admit the rest to the vote."""
        key = (task.spec.task_id, result.attempt)
        info = self._revealed.get(key)
        vt = self.vtasks.get(task.spec.task_id)
        executor = result.body.executor
        if info is None or vt is None:
            return super().admit(task, result, now)
        seed = info.batch.seed

        def unchecked(status: str) -> list[Effect]:
            vt.status[executor] = {"status": status, "attempt": result.attempt,
                                   "sampled": status != "not_sampled"}
            self._count(f"results_unchecked.{status}")
            return super(VerifiedAuction, self).admit(task, result, now)

        if not sampled(seed, executor, self.verify.sample_rate):
            return unchecked("not_sampled")
        if info.body.chunks == 0:
            return unchecked("nothing_to_check")
        ranking = rank_verifiers(seed, self.verifier_candidates(info.body.model_hash, now),
                                 exclude=(executor, self.peer))
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
        self._count("checks_started")
        effects: list[Effect] = [Emit("verify.check_started", {
            "task_id": task.spec.task_id.hex(), "executor": executor, "chunks": list(chunks)})]
        effects += self._ask(task, check, self.verify.verifiers, now)
        if not check.outstanding:
            effects += self._judge(task, check, now)
        return effects + [self._updated(task)]

    # ------------------------------------------------------------------ timers

    def _on_verify_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for task_id, vt in list(self.vtasks.items()):
            task = self.tasks.get(task_id)
            if task is None or task.finished:
                continue
            if vt.open_batch is not None and now >= vt.open_batch.closes_at_ms:
                effects += self._close_window(task, vt, now)
        for check in list(self.checks.values()):
            task = self.tasks.get(check.task_id)
            if task is None or task.finished or check.phase is not CheckPhase.CHECKING:
                continue
            late = [v for v, (_, due) in check.outstanding.items() if now >= due]
            for verifier in late:
                del check.outstanding[verifier]
                check.outcomes[verifier] = "timeout"
                self._count("verdicts_timed_out")
                effects += self._ask(task, check, 1, now)
            if late and not check.outstanding:
                effects += self._judge(task, check, now)
            if late:
                effects.append(self._updated(task))
        return effects
