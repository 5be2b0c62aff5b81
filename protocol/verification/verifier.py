"""The verifier role: re-check sampled chunks of someone else's result, return a signed verdict.

``Verifier`` takes ``CheckRequest`` s and promises:

* it checks everything a requester could have tampered with *before* computing: the request
  is signed and sent by the requester it names and addressed to us; the executor's commitment
  is signed by the executor, is for this task (hash of the ``TaskSpec``), names ``H(nonce)``
  and is one of the window's commitments; the sampled chunks are exactly the ones the seed
  chooses; answer, CoT, output ids and salt open the commitment; every fingerprint is at its
  index of the committed Merkle root (crypto.merkle with index and count). A request failing
  any of these is the requester's fault: it is penalized and answered DECLINED, never FAIL,
  so a requester cannot make a verifier convict an executor of something the executor never
  committed to;
* it declines (DECLINED) what it cannot do: a model hash it does not serve, a full queue;
* otherwise it asks its driver to re-run the prefill (``StartCheck``: the task, claimed output
  ids and text, chunk indices and fingerprints; at most ``slots`` at once, the rest wait in a
  queue of ``max_queue``) and turns ``CheckDone`` into a signed
  ``Verdict`` (PASS / FAIL with the evidence hash every verifier of this check computes the
  same way) for the requester, and into a ``protocol.ledger.events.Attest``
  (``VERIFICATION_PASSED`` / ``VERIFICATION_FAILED`` about the executor) for the ledger;
* a check still running at its timeout is cancelled (``CancelCheck``) and answered DECLINED.

The driver performs ``StartCheck`` (models/ ``check_fingerprint`` in a worker thread in the
node, a cost model in the simulator) and answers ``CheckDone`` or ``CheckFailed``.
"""

from __future__ import annotations

from dataclasses import dataclass

from crypto.keys import Identity
from crypto.merkle import verify_proof
from protocol.agents.wire import ToolCallRecord
from protocol.codec import MAX_FRAME_BYTES
from protocol.envelopes import Unopened, open_authored, open_envelope, seal
from protocol.errors import InvalidMessage
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind
from protocol.machine import Effect, Emit, Penalize, Received, Send, Tick
from protocol.market.messages import TaskSpec
from protocol.verification.messages import (
    CHECK_DOMAIN,
    COMMIT_DOMAIN,
    MAX_DETAIL,
    VERDICT_DOMAIN,
    CheckBody,
    CheckRequest,
    CommitBody,
    Verdict,
    VerdictBody,
    VerdictStatus,
)
from protocol.verification.rules import (
    choose_chunks,
    choose_layers,
    decode_proof,
    evidence_hash,
    nonce_hash,
    output_commitment,
    selection_seed,
    spec_hash,
    unpack_ids,
)

PENALTY_BAD_CHECK = 10
#: checks remembered after they finish, so a repeated request is not computed twice
MAX_DONE = 4_096
#: decoder layers a check re-runs besides layer 1, when the executor committed layer states
#: (a protocol constant: every verifier of a result draws the same ones from the seed)
LAYERS_PER_CHECK = 2


@dataclass(frozen=True, slots=True)
class VerifierConfig:
    #: model identity hashes this node can re-run
    model_hashes: frozenset[bytes]
    #: checks computed at once
    slots: int = 1
    #: checks waiting for a slot; beyond it requests are declined
    max_queue: int = 64
    max_frame: int = MAX_FRAME_BYTES


@dataclass(frozen=True, slots=True)
class StartCheck:
    check_id: bytes
    task: TaskSpec
    model_hash: bytes
    output_ids: tuple[int, ...]
    answer: str
    cot: str
    chunk_tokens: int
    chunk_indices: tuple[int, ...]
    fingerprints: tuple[bytes, ...]
    deadline_at_ms: int
    #: the executor under check and its layer-states commitment (models.layer_states): when
    #: ``states_root`` is set the check fetches the committed leaves from ``executor`` and
    #: re-runs layer 1 and ``layers`` (drawn from the seed) instead of a whole prefill
    executor: str = ""
    attempt: int = 0
    states_root: bytes = b""
    state_layers: int = 0
    layers: tuple[int, ...] = ()
    #: an agent's system prompt and tool calls: with the task, the text its model read
    system_prompt: str = ""
    tool_calls: tuple[ToolCallRecord, ...] = ()
    #: the content hash of the LoRA adapter the executor ran on (b"": the base model): the
    #: check applies it to the model it re-runs (the driver fetches it by the relay)
    adapter: bytes = b""


@dataclass(frozen=True, slots=True)
class CancelCheck:
    check_id: bytes


@dataclass(frozen=True, slots=True)
class CheckDone:
    check_id: bytes
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CheckFailed:
    """The computation itself failed (not the executor's fault): answered DECLINED."""

    check_id: bytes
    reason: str


@dataclass(slots=True)
class _Job:
    body: CheckBody
    commit: CommitBody
    evidence: bytes
    deadline_at_ms: int
    started: bool = False


def check_request_problem(body: CheckBody, commit: CommitBody, commit_hash: bytes) -> str:
    """Why ``body`` is not a faithful check of ``commit`` ("" when it is)."""
    if commit.task_id != body.task.task_id or body.task.requester != body.requester:
        return "commitment is for another task or requester"
    if spec_hash(body.task) != commit.spec_hash:
        return "task differs from the one the executor committed to"
    if nonce_hash(body.nonce) != commit.nonce_hash:
        return "nonce does not match the committed nonce hash"
    if commit_hash not in body.batch:
        return "commitment is not in the window it claims"
    seed = selection_seed(commit.task_id, body.nonce, body.batch)
    if body.chunk_indices != choose_chunks(seed, commit.executor, commit.chunks,
                                           len(body.chunk_indices)) or not body.chunk_indices:
        return "chunks are not the ones the seed chooses"
    if len(body.output_ids) // 4 != commit.tokens:
        return "token count differs from the commitment"
    if output_commitment(commit.task_id, commit.attempt, commit.executor, body, body.output_ids,
                         body.salt) != commit.commitment:
        return "output does not open the commitment"
    for index, fp, proof in zip(body.chunk_indices, body.fingerprints, body.proofs, strict=True):
        try:
            steps = decode_proof(proof)
        except ValueError:
            return "malformed Merkle proof"
        if not verify_proof(commit.fingerprint_root, fp, steps, index=index, count=commit.chunks):
            return f"fingerprint {index} is not in the committed root"
    return ""


class Verifier:
    def __init__(self, identity: Identity, config: VerifierConfig) -> None:
        self.identity = identity
        self.peer = identity.peer_id
        self.config = config
        self.jobs: dict[bytes, _Job] = {}
        self.done: dict[bytes, Verdict] = {}
        self.counters: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received) and isinstance(event.message, CheckRequest):
            return self._on_request(event.peer, event.message, now)
        if isinstance(event, CheckDone):
            status = VerdictStatus.PASS if event.passed else VerdictStatus.FAIL
            return self._finish(event.check_id, status, event.detail)
        if isinstance(event, CheckFailed):
            return self._finish(event.check_id, VerdictStatus.DECLINED, event.reason)
        if isinstance(event, Tick):
            effects: list[Effect] = []
            for cid in [c for c, j in self.jobs.items() if now >= j.deadline_at_ms]:
                self._count("checks_timed_out")
                if self.jobs[cid].started:
                    effects.append(CancelCheck(cid))
                effects += self._finish(cid, VerdictStatus.DECLINED, "timed out")
            return effects
        return []

    def next_deadline(self) -> int | None:
        return min((j.deadline_at_ms for j in self.jobs.values()), default=None)

    # ------------------------------------------------------------------ requests

    def _on_request(self, peer: str, msg: CheckRequest, now: int) -> list[Effect]:
        try:
            body = open_authored(msg.envelope, CHECK_DOMAIN, CheckBody, self.config.max_frame,
                                 sender=peer, author=lambda b: b.requester)
        except Unopened as refused:
            return refused.refusal(peer, "checks", self.counters)
        if body.verifier != self.peer:
            self._count("checks_rejected.not_ours")
            return []
        if body.check_id in self.jobs:
            self._count("checks_duplicate")
            return []
        if body.check_id in self.done:
            self._count("checks_duplicate")
            return [Send(peer, self.done[body.check_id])]
        try:
            commit = open_envelope(body.commit, COMMIT_DOMAIN, CommitBody, self.config.max_frame)
        except InvalidMessage:
            commit = None
        if commit is None or body.commit.signer != commit.executor:
            return self._refuse(peer, body, None, "commitment is not signed by its executor")
        problem = check_request_problem(body, commit, body.commit.content_hash)
        if problem:
            return self._refuse(peer, body, commit, problem)
        if commit.model_hash not in self.config.model_hashes:
            return self._decline(body, commit, "model not served here")
        if len(self.jobs) >= self.config.slots + self.config.max_queue:
            return self._decline(body, commit, "busy")
        seed = selection_seed(commit.task_id, body.nonce, body.batch)
        evidence = evidence_hash(body.commit.content_hash, seed, body.chunk_indices,
                                 body.output_ids)
        self.jobs[body.check_id] = _Job(body, commit, evidence, now + body.timeout_ms)
        self._count("checks_accepted")
        return [Emit("verify.check_received", {"task_id": commit.task_id.hex(),
                                               "requester": peer, "executor": commit.executor,
                                               "chunks": list(body.chunk_indices)}),
                *self._start_queued()]

    def _start_queued(self) -> list[Effect]:
        """Start waiting checks, oldest first, while slots are free."""
        effects: list[Effect] = []
        running = sum(1 for j in self.jobs.values() if j.started)
        for cid, job in self.jobs.items():
            if running >= self.config.slots:
                break
            if job.started:
                continue
            job.started = True
            running += 1
            body, commit = job.body, job.commit
            seed = selection_seed(commit.task_id, body.nonce, body.batch)
            layers = choose_layers(seed, commit.executor, commit.state_layers,
                                   LAYERS_PER_CHECK) if commit.states_root else ()
            effects.append(StartCheck(
                check_id=cid, task=body.task, model_hash=commit.model_hash,
                output_ids=unpack_ids(body.output_ids), answer=body.answer, cot=body.cot,
                chunk_tokens=commit.chunk_tokens, chunk_indices=body.chunk_indices,
                fingerprints=body.fingerprints, deadline_at_ms=job.deadline_at_ms,
                executor=commit.executor, attempt=commit.attempt,
                states_root=commit.states_root, state_layers=commit.state_layers,
                layers=layers, system_prompt=body.system_prompt, tool_calls=body.tool_calls,
                adapter=body.adapter))
        return effects

    def _verdict(self, body: CheckBody, commit: CommitBody | None, status: VerdictStatus,
                 evidence: bytes, detail: str) -> Verdict:
        verdict = VerdictBody(
            check_id=body.check_id, task_id=body.task.task_id,
            attempt=commit.attempt if commit is not None else 0,
            executor=commit.executor if commit is not None else "", verifier=self.peer,
            requester=body.requester, status=status, evidence_hash=evidence,
            chunk_indices=body.chunk_indices, detail=detail[:MAX_DETAIL])
        return Verdict(envelope=seal(self.identity, VERDICT_DOMAIN, verdict))

    def _decline(self, body: CheckBody, commit: CommitBody | None, why: str) -> list[Effect]:
        self._count(f"checks_declined.{why.split()[0]}")
        return [Send(body.requester, self._verdict(body, commit, VerdictStatus.DECLINED,
                                                   bytes(32), why))]

    def _refuse(self, peer: str, body: CheckBody, commit: CommitBody | None,
                why: str) -> list[Effect]:
        return [Penalize(peer, f"check request: {why}", PENALTY_BAD_CHECK),
                *self._decline(body, commit, why)]

    def _finish(self, check_id: bytes, status: VerdictStatus, detail: str) -> list[Effect]:
        job = self.jobs.pop(check_id, None)
        if job is None:
            return []
        verdict = self._verdict(job.body, job.commit, status, job.evidence, detail)
        self.done[check_id] = verdict
        while len(self.done) > MAX_DONE:
            del self.done[next(iter(self.done))]
        self._count(f"verdicts.{status.value}")
        effects: list[Effect] = [
            Send(job.body.requester, verdict),
            Emit("verify.verdict_sent", {"task_id": job.commit.task_id.hex(),
                                         "executor": job.commit.executor,
                                         "status": status.value, "detail": detail}),
        ]
        effects += self._start_queued()
        if status is not VerdictStatus.DECLINED:
            kind = AttestationKind.VERIFICATION_PASSED if status is VerdictStatus.PASS \
                else AttestationKind.VERIFICATION_FAILED
            effects.append(LedgerAttest(subject=job.commit.executor,
                                        object_id=job.commit.task_id, kind=kind,
                                        outcome=(detail or status.value)[:128],
                                        evidence_hash=job.evidence))
        return effects
