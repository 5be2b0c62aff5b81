"""Requester side of commitment-based verification, wrapped around the task market's auction.

``VerifiedAuction`` is the task market's ``protocol.market.auction.Auction`` with commit/reveal
and sampled checks in front of the vote: a result reaches ``Auction.admit`` only through them.
For every task it promises:

* **Terms**: right after each ``Assign`` it sends the executor signed ``Terms`` naming
  ``H(nonce)`` for a fresh per-task nonce, so the nonce is fixed before any commitment.
* **Commit window**: a ``Commit`` is accepted only from the assigned executor of a running
  attempt, before its due time, naming our nonce hash, the hash of the task we assigned, the
  bid's model hash, and chunk/token counts that fit (an inconsistent one fails the attempt; a
  forged or malformed one is penalized). A task's window opens at its first commitment and
  closes when every running attempt has committed or after ``commit_window_ms``; running
  attempts that missed it are replaced. A plain ``Result`` (no commitment) is refused.
* **Reveal**: at the close, every committed executor gets a ``RevealRequest`` with the nonce
  and ``reveal_ms`` to answer (a k=1 task's executor reveals unasked, right behind its
  commitment, which closes the window at once: ``rules.reveals_with_commit``). A ``Reveal`` that does not open its commitment exactly
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

``VerifiedAuction`` holds the market's ``Auction`` (given every auction option, one
constructor) and wraps its ``handle``: commitments, reveals and verdicts go to its components,
everything else to the auction, and every effect is dressed on the way out (Terms after each
``Assign``, verification statuses in snapshots). The auction picks no bid from an excluded
peer (its ``excluded`` option is this class's ``Exclusions``). The components:
``CommitReveal`` (protocol/verification/commits.py: commit windows, reveals) and
``VerdictChecks`` (protocol/verification/verdicts.py: sampling, asking verifiers, their
verdicts, deciding and the consequences). This class owns their records (``vtasks``,
``checks``, ``exclusions``).

Own effects besides the auction's: ``protocol.ledger.events.Attest`` (a verification
attestation for the ledger, performed by the node). Task snapshots gain a ``verification`` map
(executor -> status, see protocol/verification/state.py) and ``results[i]["verification"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from random import Random

from crypto.keys import Identity
from protocol.codec import decode
from protocol.envelopes import seal
from protocol.machine import Effect, Emit, Received, Send, Tick
from protocol.market.auction import Auction
from protocol.market.events import AuctionConfig, TaskUpdated
from protocol.market.messages import Assign, AssignBody, Result
from protocol.market.options import AuctionOptions
from protocol.market.refusals import count
from protocol.market.selection import Selector
from protocol.market.state import TaskSnapshot
from protocol.market.views import AuctionViews
from protocol.verification.commits import CommitReveal
from protocol.verification.messages import (
    TERMS_DOMAIN,
    Commit,
    Reveal,
    Terms,
    TermsBody,
    Verdict,
)
from protocol.verification.state import (
    Check,
    CheckPhase,
    Exclusions,
    VerifyConfig,
    VerifyTask,
    move_check,
    status_of,
)
from protocol.verification.verdicts import VerdictChecks

__all__ = ["VerifiedAuction", "VerifyConfig"]


class VerifiedAuction(AuctionViews):
    auction: Auction

    def __init__(
        self,
        identity: Identity,
        selector: Selector,
        rng: Random,
        config: AuctionConfig | None = None,
        options: AuctionOptions | None = None,
        *,
        verify: VerifyConfig | None = None,
        verifier_candidates: Callable[[bytes, int], Sequence[str]] = lambda h, now: (),
    ) -> None:
        """The auction's options as ``Auction`` takes them, its ``excluded`` (whether the ledger
        shows a peer failing) joined by our own convictions; ``verify`` the verification's;
        ``verifier_candidates(model_hash, now)``: ledger peers that may verify such a result."""
        options = options if options is not None else AuctionOptions()
        self.verify = verify if verify is not None else VerifyConfig()
        self._exclusions = Exclusions(options.excluded, self.verify.exclusion_ms)
        self.auction = Auction(identity, selector, rng, config,
                               replace(options, excluded=self._exclusions.is_excluded))
        self.vtasks: dict[bytes, VerifyTask] = {}
        self.checks: dict[tuple[bytes, int], Check] = {}
        self.verdicts = VerdictChecks(self.auction, self.verify, verifier_candidates,
                                      self._exclusions, self.vtasks, self.checks)
        self.commits = CommitReveal(self.auction, self.verify, self.vtasks, self.verdicts)

    # ------------------------------------------------------------------ what drivers read

    @property
    def exclusions(self) -> dict[str, int]:
        """Peers we convicted -> until when we exclude them."""
        return self._exclusions.convicted

    def is_excluded(self, peer: str, now: int) -> bool:
        return self._exclusions.is_excluded(peer, now)

    @property
    def verifier_candidates(self) -> Callable[[bytes, int], Sequence[str]]:
        return self.verdicts.verifier_candidates

    @property
    def excluded(self) -> Callable[[str, int], bool]:
        """Whether the ledger shows a peer failing (the ``excluded`` option)."""
        return self._exclusions.by_ledger

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            msg = event.message
            if isinstance(msg, Commit):
                effects = self.commits.on_commit(event.peer, msg, now)
            elif isinstance(msg, Reveal):
                effects = self.commits.on_reveal(event.peer, msg, now)
            elif isinstance(msg, Verdict):
                effects = self.verdicts.on_verdict(event.peer, msg, now)
            elif isinstance(msg, Result):
                count(self.counters, "results_rejected.uncommitted")
                effects = [Emit("task.result_rejected", {"peer": event.peer,
                                                         "why": "uncommitted"})]
            else:
                effects = self.auction.handle(event, now)
        else:
            effects = self.auction.handle(event, now)
            if isinstance(event, Tick):
                effects += self._on_verify_tick(now)
        return self._dress(effects, now)

    def next_deadline(self) -> int | None:
        times = [t for t in (self.auction.next_deadline(),) if t is not None]
        for vt in self.vtasks.values():
            if vt.open_batch is not None:
                times.append(vt.open_batch.closes_at_ms)
        for check in self.checks.values():
            times.extend(due for _, due in check.outstanding.values())
        return min(times) if times else None

    # ------------------------------------------------------------------ wrapping the auction

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
                vt = self.commits.vtask(body.task.task_id)
                terms = TermsBody(task_id=body.task.task_id, attempt=body.attempt,
                                  requester=self.auction.peer, executor=body.executor,
                                  nonce_hash=vt.nonce_hash)
                out.append(Send(e.peer, Terms(envelope=seal(self.auction.identity, TERMS_DOMAIN,
                                                            terms))))
        for key, check in list(self.checks.items()):
            task = self.tasks.get(key[0])
            if task is None or task.finished:
                move_check(check, CheckPhase.ABANDONED)
                self.verdicts.set_status(check, now)
                del self.checks[key]
                count(self.counters, "checks_abandoned")
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

    # ------------------------------------------------------------------ timers

    def _on_verify_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for task_id, vt in list(self.vtasks.items()):
            task = self.tasks.get(task_id)
            if task is None or task.finished:
                continue
            if vt.open_batch is not None and now >= vt.open_batch.closes_at_ms:
                effects += self.commits.close_window(task, vt, now)
        return effects + self.verdicts.on_tick(now)
