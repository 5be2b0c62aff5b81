"""Commit and reveal: the first half of the requester's verification.

``CommitRevealAuction`` is the market's ``protocol.market.auction.Auction`` plus the commit window.
It takes ``Commit`` s (checked, then batched into windows), sends ``RevealRequest`` s when a
window closes, and opens each ``Reveal`` against its commitment: a matching result goes on to
the auction's own result checks, which end in ``admit`` (the seam ``VerifiedAuction``
overrides); a mismatching one goes to ``_convict`` (protocol/verification/verdicts.py).
protocol/verification/requester.py completes this class and lists the promises all the parts
keep.
"""

from __future__ import annotations

from collections.abc import Callable
from random import Random

from crypto.keys import Identity
from crypto.merkle import merkle_root
from protocol.envelopes import PENALTY_FORGED, Unopened, open_authored, open_envelope
from protocol.errors import InvalidMessage
from protocol.machine import Effect, Emit, Send
from protocol.market.auction import Auction
from protocol.market.events import FAILED, AuctionConfig
from protocol.market.messages import RESULT_DOMAIN, Result, ResultBody
from protocol.market.selection import Selector
from protocol.market.state import Attempt, AttemptState, OpenTask
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
    result_commitment,
    reveal_evidence,
    selection_seed,
    spec_hash,
)
from protocol.verification.state import Batch, CommitInfo, VerifyConfig, VerifyTask


class CommitRevealAuction(Auction):
    def __init__(
        self,
        identity: Identity,
        selector: Selector,
        rng: Random,
        config: AuctionConfig | None = None,
        reputation: Callable[[str], float] = lambda peer: 0.5,
        *,
        verify: VerifyConfig | None = None,
    ) -> None:
        super().__init__(identity, selector, rng, config, reputation)
        self.verify = verify if verify is not None else VerifyConfig()
        self.vtasks: dict[bytes, VerifyTask] = {}
        #: the reveal being admitted right now (set around the auction's result checks)
        self._revealed: dict[tuple[bytes, int], CommitInfo] = {}

    def _convict(self, task: OpenTask, attempt: Attempt, why: str, evidence: bytes,
                 now: int) -> list[Effect]:
        raise NotImplementedError  # protocol.verification.verdicts.VerdictChecks

    def _vtask(self, task_id: bytes) -> VerifyTask:
        vt = self.vtasks.get(task_id)
        if vt is None:
            nonce = self.rng.randbytes(NONCE_LEN)
            vt = self.vtasks[task_id] = VerifyTask(nonce, nonce_hash(nonce))
        return vt

    # ------------------------------------------------------------------ commitments

    def _on_commit(self, peer: str, msg: Commit, now: int) -> list[Effect]:
        reject = self._rejecter("verify", "commit", peer)

        try:
            body = open_authored(msg.envelope, COMMIT_DOMAIN, CommitBody,
                                 self.config.max_frame, sender=peer, author=lambda b: b.executor)
        except Unopened as refused:
            return reject(refused.why, PENALTY_FORGED)
        found = self._assigned(peer, body.task_id, body.attempt, reject)
        if isinstance(found, list):
            return found
        task, attempt = found
        vt = self._vtask(body.task_id)
        if body.attempt in vt.commits:
            return reject("duplicate")
        if attempt.state is not AttemptState.ASSIGNED or task.finished or now > attempt.due_at_ms:
            return reject("late")
        why = self._inconsistent(task, attempt, body, vt)
        if why:
            return reject("inconsistent") + self._fail_attempt(
                task, attempt, f"malformed:commitment {why}", FAILED, now, cancel=False)
        batch = vt.open_batch
        if batch is None:
            batch = vt.open_batch = Batch(opened_at_ms=now,
                                          closes_at_ms=now + self.verify.commit_window_ms)
        batch.attempts.append(body.attempt)
        vt.commits[body.attempt] = CommitInfo(body, msg.envelope, msg.envelope.content_hash,
                                              batch, now)
        attempt.due_at_ms = max(attempt.due_at_ms, batch.closes_at_ms + self.verify.reveal_ms)
        self._count("commits_accepted")
        effects: list[Effect] = [Emit("verify.commit", {
            "task_id": body.task_id.hex(), "peer": peer, "attempt": body.attempt,
            "chunks": body.chunks, "tokens": body.tokens})]
        if all(a.attempt in vt.commits for a in task.active):
            effects += self._close_window(task, vt, now)
        return effects + [self._updated(task)]

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

    def _close_window(self, task: OpenTask, vt: VerifyTask, now: int) -> list[Effect]:
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
                effects.append(Send(attempt.peer, RevealRequest(
                    task_id=task.spec.task_id, attempt=attempt.attempt, nonce=vt.nonce)))
            elif attempt.attempt not in vt.commits and attempt.assigned_at_ms <= batch.opened_at_ms:
                # running before the window opened and still silent: too slow to trust, since
                # reveals now begin (attempts assigned later commit in the next window)
                effects += self._fail_attempt(task, attempt, "missed the commit window", None,
                                              now)
        return effects

    # ------------------------------------------------------------------ reveals

    def _on_reveal(self, peer: str, msg: Reveal, now: int) -> list[Effect]:
        reject = self._rejecter("verify", "reveal", peer)

        task = self.tasks.get(msg.task_id)
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
            return reject("mismatch") + self._convict(task, attempt, why, evidence, now)
        key = (msg.task_id, msg.attempt)
        self._revealed[key] = info
        try:
            return self._on_result(peer, Result(envelope=msg.result), now)
        finally:
            self._revealed.pop(key, None)

    def _reveal_mismatch(self, c: CommitBody, msg: Reveal) -> str:
        try:
            body = open_envelope(msg.result, RESULT_DOMAIN, ResultBody, self.config.max_frame)
        except InvalidMessage:
            return "result does not open"
        if msg.result.signer != c.executor or body.executor != c.executor:
            return "result is someone else's"
        if (body.task_id, body.attempt) != (c.task_id, c.attempt):
            return "result is for another task or attempt"
        if result_commitment(c.task_id, c.attempt, c.executor, body.answer, body.cot,
                             msg.output_ids, msg.salt) != c.commitment:
            return "answer, CoT, tokens or salt differ from the commitment"
        if body.model_hash != c.model_hash:
            return "model hash differs from the commitment"
        if len(body.fingerprints) != c.chunks or len(msg.output_ids) // 4 != c.tokens:
            return "chunk or token count differs from the commitment"
        root = merkle_root(body.fingerprints) if body.fingerprints else b""
        if root != c.fingerprint_root or body.fingerprint_root != c.fingerprint_root:
            return "fingerprints differ from the committed root"
        return ""

