"""Executor side of commit/reveal: commit to a finished result, reveal it only when asked.

``VerifiedExecutor`` is the market's ``protocol.market.executor.Executor`` with its delivery seam
(``deliver``) replaced. It promises:

* it keeps the requester's signed ``Terms`` (nonce hash) for the tasks it holds a bid or job
  for, checked to be signed and sent by that task's requester and addressed to this node;
* when a computation finishes it sends a signed ``Commit`` — ``result_commitment`` of (answer,
  CoT, output token ids, a fresh 32-byte salt), the Merkle root it computes itself over the
  chunk fingerprints, the root of the layer states its node keeps (when it keeps them), the
  chunk and token counts, the model hash, the hash of the task it was
  assigned and the requester's nonce hash — and nothing else;
* if the Terms have not arrived yet it waits up to ``terms_grace_ms`` for them, then (a
  requester that does not verify) sends the plain ``Result`` as the market does;
* it sends the ``Reveal`` (the signed ``Result``, the salt, the packed output ids) only to the
  task's requester, only after a ``RevealRequest`` whose nonce matches the Terms' hash, and
  again on a repeated request (same bytes: idempotent); for a k=1 task right behind its
  ``Commit`` instead, unasked (``rules.reveals_with_commit``);
* it never learns whether its result is checked: check requests go from the requester to
  verifiers and never reach the executor.

State per (task, attempt) is forgotten with the job (``REMEMBER_MS``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from random import Random

from crypto.envelope import Envelope
from crypto.keys import Identity
from crypto.merkle import merkle_root
from protocol.envelopes import Unopened, open_authored, seal
from protocol.machine import Effect, Emit, Penalize, Received, Send, Tick
from protocol.market.events import ComputeDone
from protocol.market.executor import REMEMBER_MS, Executor, ExecutorConfig
from protocol.market.jobs import Job
from protocol.market.messages import RESULT_DOMAIN, RejectReason, Result, ResultBody
from protocol.verification.messages import (
    COMMIT_DOMAIN,
    SALT_LEN,
    TERMS_DOMAIN,
    Commit,
    CommitBody,
    Reveal,
    RevealRequest,
    Terms,
    TermsBody,
)
from protocol.verification.rules import (
    nonce_hash,
    output_commitment,
    pack_ids,
    reveals_with_commit,
    spec_hash,
)

#: tokens per fingerprint chunk (models/ fingerprints 32-token chunks)
DEFAULT_CHUNK_TOKENS = 32
#: how long a finished result waits for late Terms before it goes out as a plain Result (the
#: Terms leave the requester with the assignment, so they are late only if delayed or lost; a
#: requester that does not verify sends none and gets every result this much later). The one
#: value daemon and simulator both use.
DEFAULT_TERMS_GRACE_MS = 500
PENALTY_BAD_NONCE = 10
MAX_TERMS = 4_096

Key = tuple[bytes, int]


@dataclass(slots=True)
class _Terms:
    requester: str
    nonce_hash: bytes
    forget_at_ms: int


@dataclass(slots=True)
class _Sealed:
    """A finished result, committed (``commit`` set) or waiting for its Terms."""

    requester: str
    body: ResultBody
    result: Envelope
    salt: bytes
    output_ids: bytes
    spec_hash: bytes
    forget_at_ms: int
    waiting_until_ms: int = 0
    commit: CommitBody | None = None
    revealed: int = 0
    #: reveal right behind the commitment, unasked (rules.reveals_with_commit)
    reveal_with_commit: bool = False
    states_root: bytes = b""
    state_layers: int = 0


class VerifiedExecutor(Executor):
    def __init__(self, identity: Identity, config: ExecutorConfig, rng: Random, *,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                 terms_grace_ms: int = DEFAULT_TERMS_GRACE_MS) -> None:
        super().__init__(identity, config)
        self.rng = rng
        self.chunk_tokens = chunk_tokens
        self.terms_grace_ms = terms_grace_ms
        self._terms: dict[Key, _Terms] = {}
        self._sealed: dict[Key, _Sealed] = {}
        self._ids: dict[Key, tuple[int, ...]] = {}
        self._states: dict[Key, tuple[bytes, int]] = {}
        self._now = 0

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        self._now = now
        if isinstance(event, Received):
            if isinstance(event.message, Terms):
                return self._on_terms(event.peer, event.message, now)
            if isinstance(event.message, RevealRequest):
                return self._on_reveal_request(event.peer, event.message)
        if isinstance(event, ComputeDone):
            # the root is ours to compute, never taken on trust from the backend
            root = merkle_root(event.fingerprints) if event.fingerprints else b""
            event = dataclasses.replace(event, fingerprint_root=root)
            self._ids[(event.task_id, event.attempt)] = event.output_ids
            self._states[(event.task_id, event.attempt)] = (event.states_root, event.state_layers)
        effects = super().handle(event, now)
        if isinstance(event, ComputeDone):
            self._ids.pop((event.task_id, event.attempt), None)
            self._states.pop((event.task_id, event.attempt), None)
        if isinstance(event, Tick):
            effects += self._on_verify_tick(now)
        return effects

    def next_deadline(self) -> int | None:
        times = [t.forget_at_ms for t in self._terms.values()]
        times += [s.waiting_until_ms if s.commit is None else s.forget_at_ms
                  for s in self._sealed.values()]
        base = super().next_deadline()
        if base is not None:
            times.append(base)
        return min(times) if times else None

    # ------------------------------------------------------------------ terms

    def _on_terms(self, peer: str, msg: Terms, now: int) -> list[Effect]:
        try:
            body = open_authored(msg.envelope, TERMS_DOMAIN, TermsBody, self.config.max_frame,
                                 sender=peer, author=lambda b: b.requester)
        except Unopened as refused:
            return refused.refusal(peer, "terms", self.counters)
        job = self.jobs.get(body.task_id)
        if body.executor != self.peer or job is None or job.requester != body.requester:
            self._count("terms_rejected.unmatched")
            return []
        key = (body.task_id, body.attempt)
        if key not in self._terms and len(self._terms) >= MAX_TERMS:
            self._count("terms_rejected.full")
            return []
        self._terms[key] = _Terms(body.requester, body.nonce_hash, now + REMEMBER_MS)
        self._count("terms_accepted")
        sealed = self._sealed.get(key)
        if sealed is not None and sealed.commit is None and sealed.requester == body.requester:
            return self._commit(key, sealed)
        return []

    # ------------------------------------------------------------------ commit (the seam)

    def deliver(self, job: Job, body: ResultBody) -> list[Effect]:
        """Commit to the result instead of sending it (see the module docstring)."""
        key = (body.task_id, body.attempt)
        assert job.task is not None  # a job that computed was assigned a task
        try:
            ids = pack_ids(self._ids.get(key, ()))
        except ValueError as exc:
            return self._reject(job.requester, body.task_id, body.attempt,
                                RejectReason.COMPUTE_FAILED, f"bad output ids: {exc}"[:128])
        sealed = _Sealed(
            requester=job.requester, body=body,
            result=seal(self.identity, RESULT_DOMAIN, body), salt=self.rng.randbytes(SALT_LEN),
            output_ids=ids, spec_hash=spec_hash(job.task), forget_at_ms=self._now + REMEMBER_MS,
            reveal_with_commit=reveals_with_commit(job.task.k),
        )
        sealed.states_root, sealed.state_layers = self._states.get(key, (b"", 0))
        self._sealed[key] = sealed
        terms = self._terms.get(key)
        if terms is not None and terms.requester == job.requester:
            return self._commit(key, sealed)
        sealed.waiting_until_ms = self._now + self.terms_grace_ms
        self._count("commits_waiting_for_terms")
        return [Emit("verify.commit_waiting", {"task_id": body.task_id.hex()})]

    def _commit(self, key: Key, sealed: _Sealed) -> list[Effect]:
        body, terms = sealed.body, self._terms[key]
        n_ids = len(sealed.output_ids) // 4
        commit = CommitBody(
            task_id=body.task_id, attempt=body.attempt, executor=self.peer,
            spec_hash=sealed.spec_hash, nonce_hash=terms.nonce_hash,
            commitment=output_commitment(body.task_id, body.attempt, self.peer, body,
                                         sealed.output_ids, sealed.salt),
            fingerprint_root=body.fingerprint_root, chunks=len(body.fingerprints),
            chunk_tokens=self.chunk_tokens, tokens=n_ids, model_hash=body.model_hash,
            states_root=sealed.states_root, state_layers=sealed.state_layers,
        )
        try:
            commit.check()
        except ValueError as exc:
            del self._sealed[key]
            return self._reject(sealed.requester, body.task_id, body.attempt,
                                RejectReason.COMPUTE_FAILED, f"uncommittable: {exc}"[:128])
        sealed.commit = commit
        self._count("commits_sent")
        effects: list[Effect] = [
            Send(sealed.requester, Commit(envelope=seal(self.identity, COMMIT_DOMAIN, commit))),
            Emit("verify.committed", {"task_id": body.task_id.hex(), "attempt": body.attempt,
                                      "chunks": commit.chunks, "tokens": n_ids}),
        ]
        if sealed.reveal_with_commit:  # in order on the wire: it arrives after the commit
            effects += self._reveal(sealed, sealed.requester, body.task_id, body.attempt)
        return effects

    # ------------------------------------------------------------------ reveal

    def _on_reveal_request(self, peer: str, msg: RevealRequest) -> list[Effect]:
        key = (msg.task_id, msg.attempt)
        sealed = self._sealed.get(key)
        if sealed is None or sealed.commit is None or peer != sealed.requester:
            self._count("reveal_requests_ignored")
            return []
        if nonce_hash(msg.nonce) != sealed.commit.nonce_hash:
            self._count("reveal_requests_bad_nonce")
            return [Penalize(peer, "reveal request nonce does not match the terms",
                             PENALTY_BAD_NONCE)]
        return self._reveal(sealed, peer, msg.task_id, msg.attempt)

    def _reveal(self, sealed: _Sealed, peer: str, task_id: bytes, attempt: int) -> list[Effect]:
        sealed.revealed += 1
        self._count("reveals_sent")
        return [
            Send(peer, Reveal(task_id=task_id, attempt=attempt, result=sealed.result,
                              salt=sealed.salt, output_ids=sealed.output_ids)),
            Emit("verify.revealed", {"task_id": task_id.hex(), "attempt": attempt}),
        ]

    # ------------------------------------------------------------------ timers

    def _on_verify_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for key, sealed in list(self._sealed.items()):
            if sealed.commit is None and now >= sealed.waiting_until_ms:
                # no Terms came: this requester does not verify; deliver as the market does
                del self._sealed[key]
                self._count("results_sent_plain")
                effects += [Send(sealed.requester, Result(envelope=sealed.result)),
                            Emit("task.result_sent", {"task_id": key[0].hex(),
                                                      "answer": sealed.body.answer,
                                                      "plain": True})]
            elif now >= sealed.forget_at_ms:
                del self._sealed[key]
        for key, terms in list(self._terms.items()):
            if now >= terms.forget_at_ms:
                del self._terms[key]
        return effects
