"""Commit and reveal: the first step of the requester's verification.

``CommitReveal`` is a component ``VerifiedAuction`` (protocol/verification/requester.py, which
lists the promises and owns the per-task ``vtasks``) holds. It takes ``Commit`` s (checked,
then batched into windows), sends ``RevealRequest`` s when a window closes (none for a k=1
task, whose executor reveals right behind its commitment: rules.reveals_with_commit), and
opens each ``Reveal`` against its commitment: a matching result goes through the auction's
own result checks (``Auction.check_result``) and then to ``VerdictChecks.admit``
(protocol/verification/verdicts.py), which samples it for checking; a mismatching one is
convicted there (``VerdictChecks.convict``).
"""

from __future__ import annotations

from crypto.merkle import merkle_root
from protocol.envelopes import open_envelope
from protocol.errors import InvalidMessage
from protocol.machine import Effect, Emit, Send
from protocol.market.auction import Auction
from protocol.market.events import FAILED, TaskUpdated
from protocol.market.messages import RESULT_DOMAIN, Result, ResultBody
from protocol.market.refusals import assigned, count, opened, rejecter
from protocol.market.state import Attempt, AttemptState, OpenTask, snapshot
from protocol.verification.messages import (
    COMMIT_DOMAIN,
    NONCE_LEN,
    Commit,
    CommitBody,
    Reveal,
    RevealRequest,
)
from protocol.verification.rules import (
    nonce_hash,
    output_commitment,
    reveal_evidence,
    reveals_with_commit,
    selection_seed,
    spec_hash,
)
from protocol.verification.state import Batch, CommitInfo, VerifyConfig, VerifyTask
from protocol.verification.verdicts import VerdictChecks


class CommitReveal:
    """Commit windows and reveals for the ``VerifiedAuction`` that holds it."""

    def __init__(self, auction: Auction, verify: VerifyConfig, vtasks: dict[bytes, VerifyTask],
                 verdicts: VerdictChecks) -> None:
        self.auction = auction
        self.verify = verify
        self.vtasks = vtasks
        self.verdicts = verdicts

    def vtask(self, task_id: bytes) -> VerifyTask:
        vt = self.vtasks.get(task_id)
        if vt is None:
            nonce = self.auction.rng.randbytes(NONCE_LEN)
            vt = self.vtasks[task_id] = VerifyTask(nonce, nonce_hash(nonce))
        return vt

    # ------------------------------------------------------------------ commitments

    def on_commit(self, peer: str, msg: Commit, now: int) -> list[Effect]:
        reject = rejecter(self.auction.counters, "verify", "commit", peer)
        body = opened(msg.envelope, COMMIT_DOMAIN, CommitBody, self.auction.config.max_frame,
                      peer, lambda b: b.executor, reject)
        if isinstance(body, list):
            return body
        found = assigned(self.auction.tasks, peer, body.task_id, body.attempt, reject)
        if isinstance(found, list):
            return found
        task, attempt = found
        vt = self.vtask(body.task_id)
        if body.attempt in vt.commits:
            return reject("duplicate")
        if attempt.state is not AttemptState.ASSIGNED or task.finished or now > attempt.due_at_ms:
            return reject("late")
        why = self._inconsistent(task, attempt, body, vt)
        if why:
            return reject("inconsistent") + self.auction.fail_attempt(
                task, attempt, f"malformed:commitment {why}", FAILED, now, cancel=False)
        batch = vt.open_batch
        if batch is None:
            batch = vt.open_batch = Batch(opened_at_ms=now,
                                          closes_at_ms=now + self.verify.commit_window_ms)
        batch.attempts.append(body.attempt)
        vt.commits[body.attempt] = CommitInfo(body, msg.envelope, msg.envelope.content_hash,
                                              batch, now)
        attempt.due_at_ms = max(attempt.due_at_ms, batch.closes_at_ms + self.verify.reveal_ms)
        count(self.auction.counters, "commits_accepted")
        effects: list[Effect] = [Emit("verify.commit", {
            "task_id": body.task_id.hex(), "peer": peer, "attempt": body.attempt,
            "chunks": body.chunks, "tokens": body.tokens})]
        if all(a.attempt in vt.commits for a in task.active):
            effects += self.close_window(task, vt, now)
        return effects + [TaskUpdated(snapshot(task))]

    def _inconsistent(self, task: OpenTask, attempt: Attempt, body: CommitBody,
                      vt: VerifyTask) -> str:
        if body.nonce_hash != vt.nonce_hash:
            return "names another nonce"
        if body.spec_hash != spec_hash(task.spec):
            return "is for another task"
        bid_hash = attempt.bid.body.model_hash
        if bid_hash and body.model_hash != bid_hash:
            return "names another model than the bid"
        if vt.committed_by_ms is not None and attempt.assigned_at_ms <= vt.committed_by_ms:
            return "missed its commit window"
        if self.verify.require_fingerprints and body.tokens > 0 and body.chunks == 0:
            return "has no fingerprints"
        return ""

    def close_window(self, task: OpenTask, vt: VerifyTask, now: int) -> list[Effect]:
        batch = vt.open_batch
        if batch is None:
            return []
        vt.open_batch = None
        batch.closed_at_ms = now
        vt.committed_by_ms = batch.opened_at_ms
        batch.seed = selection_seed(task.spec.task_id, vt.nonce,
                                    [vt.commits[a].hash for a in batch.attempts])
        effects: list[Effect] = [Emit("verify.window_closed", {
            "task_id": task.spec.task_id.hex(), "commitments": len(batch.attempts)})]
        for attempt in list(task.active):
            if task.finished:
                break
            if attempt.attempt in batch.attempts:
                attempt.due_at_ms = now + self.verify.reveal_ms
                if not reveals_with_commit(task.spec.k):  # else it follows the commitment
                    effects.append(Send(attempt.peer, RevealRequest(
                        task_id=task.spec.task_id, attempt=attempt.attempt, nonce=vt.nonce)))
            elif attempt.attempt not in vt.commits and attempt.assigned_at_ms <= batch.opened_at_ms:
                # running before the window opened and still silent: too slow to trust, since
                # reveals now begin (attempts assigned later commit in the next window)
                effects += self.auction.fail_attempt(task, attempt, "missed the commit window",
                                                     None, now)
        return effects

    # ------------------------------------------------------------------ reveals

    def on_reveal(self, peer: str, msg: Reveal, now: int) -> list[Effect]:
        reject = rejecter(self.auction.counters, "verify", "reveal", peer)

        task = self.auction.tasks.get(msg.task_id)
        vt = self.vtasks.get(msg.task_id)
        info = vt.commits.get(msg.attempt) if vt is not None else None
        if task is None or vt is None or info is None or info.body.executor != peer:
            return reject("uncommitted")
        if info.batch.closed_at_ms is None:
            return reject("early")
        if info.reveal is not None:
            return reject("duplicate")
        attempt = task.attempts[msg.attempt]
        if attempt.state is not AttemptState.ASSIGNED or task.finished:
            return reject("late")
        info.reveal = msg
        why = self._reveal_mismatch(info.body, msg)
        if why:
            evidence = reveal_evidence(info.hash, msg.result.content_hash, msg.salt,
                                       msg.output_ids)
            return reject("mismatch") + self.verdicts.convict(task, attempt, why, evidence, now)
        checked = self.auction.check_result(peer, Result(envelope=msg.result), now)
        if isinstance(checked, list):
            return checked
        return self.verdicts.admit(task, checked, info, now)

    def _reveal_mismatch(self, c: CommitBody, msg: Reveal) -> str:
        try:
            body = open_envelope(msg.result, RESULT_DOMAIN, ResultBody,
                                 self.auction.config.max_frame)
        except InvalidMessage:
            return "result does not open"
        if msg.result.signer != c.executor or body.executor != c.executor:
            return "result is someone else's"
        if (body.task_id, body.attempt) != (c.task_id, c.attempt):
            return "result is for another task or attempt"
        if output_commitment(c.task_id, c.attempt, c.executor, body, msg.output_ids,
                             msg.salt) != c.commitment:
            return "answer, CoT, tokens or salt differ from the commitment"
        if body.model_hash != c.model_hash:
            return "model hash differs from the commitment"
        if len(body.fingerprints) != c.chunks or len(msg.output_ids) // 4 != c.tokens:
            return "chunk or token count differs from the commitment"
        root = merkle_root(body.fingerprints) if body.fingerprints else b""
        if root != c.fingerprint_root or body.fingerprint_root != c.fingerprint_root:
            return "fingerprints differ from the committed root"
        return ""

