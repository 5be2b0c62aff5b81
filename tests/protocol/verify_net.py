"""A deterministic harness for verification tests: one VerifiedAuction, executors, verifiers.

Like tests/protocol/market_net.py: every message crosses the real codec with a fixed latency
on a virtual clock, machines are ticked at their deadlines, ``tap`` may replace or drop any
delivered message. The "model" is a stand-in with the properties that matter: output ids and
per-chunk fingerprints are functions of (weights key, prompt, output prefix), so another model
or a changed token changes the fingerprint of its chunk and of every later chunk; the CoT text
is the detokenized output.

Executor behaviours: ok, other_model (weights of another quantization, claims the advertised
hash), tamper (changes the first generated token after fingerprinting), tamper_last (changes
the last one), fabricated_cot (honest tokens, made-up CoT text), silent.
Verifier behaviours: honest, lazy (always PASS), framer (always FAIL), silent, blind (serves
no model: declines).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from crypto.hashing import digest
from crypto.keys import Identity
from protocol.agents.wire import ToolCallRecord, tool_transcript
from protocol.codec import Message, decode, encode
from protocol.ledger.events import Attest as LedgerAttest
from protocol.machine import Emit, Penalize, Publish, Received, Send, Tick
from protocol.market.auction import Attest, AuctionConfig, SubmitTask, TaskUpdated
from protocol.market.executor import (
    CancelCompute,
    ComputeDone,
    ExecutorConfig,
    ServedModel,
    StartCompute,
)
from protocol.market.selection import ScoreSelector
from protocol.verification.executor import VerifiedExecutor
from protocol.verification.requester import VerifiedAuction, VerifyConfig
from protocol.verification.rules import pack_ids
from protocol.verification.verifier import (
    CancelCheck,
    CheckDone,
    StartCheck,
    Verifier,
    VerifierConfig,
)

LATENCY_MS = 2
TRUE_KEY, OTHER_KEY = b"smollm2-q4_1", b"smollm2-q2_k"
MODEL_HASH = digest(TRUE_KEY)
MODEL = ServedModel(name="smollm2-135m", family="smollm2", context=2048, model_hash=MODEL_HASH,
                    tokens_per_s=100.0, price_per_1k=0.0)
CHUNK = 32
#: 3 full chunks and a partial one
TOKENS = 3 * CHUNK + 7


def ident(n: int) -> Identity:
    return Identity.from_seed(n.to_bytes(2, "big") * 16)


def generate(key: bytes, question: str, n: int = TOKENS) -> list[int]:
    return [int.from_bytes(digest(key + question.encode() + i.to_bytes(4, "big"))[:2], "big")
            for i in range(n)]


def fingerprints(key: bytes, question: str, ids: list[int], chunk: int = CHUNK) -> list[bytes]:
    return [digest(key + question.encode() + pack_ids(ids[:min(len(ids), end)]))[:24]
            for end in range(chunk, len(ids) + chunk, chunk)]


def detok(ids: list[int] | tuple[int, ...]) -> str:
    return " ".join(f"t{i}" for i in ids) + "\nFinal answer: 42"


#: what the "agent" executor's model read besides the task: its prompt and its tool call
AGENT_PROMPT = "You compute exactly."
AGENT_CALLS = (ToolCallRecord(name="calculator", arguments='{"expression":"6*7"}', output="42"),)
#: the LoRA adapter an "adapter" worker runs on (its content hash); the fake model's weights
#: are its key plus the adapter's hash, on the executor as on the verifier
ADAPTER, OTHER_ADAPTER = b"\xad" * 32, b"\xbe" * 32


def read_besides(calls: tuple[ToolCallRecord, ...], system_prompt: str) -> str:
    """The text an agent's model reads besides the task ("" for a plain executor)."""
    return f"|{system_prompt}|{tool_transcript(calls)}" if calls or system_prompt else ""


@dataclass
class Worker:
    machine: VerifiedExecutor
    behaviour: str = "ok"
    compute_ms: int = 100
    started: list[StartCompute] = field(default_factory=list)

    def solve(self, e: StartCompute) -> ComputeDone:
        calls, system = (AGENT_CALLS, AGENT_PROMPT) if self.behaviour == "agent" else ((), "")
        q = e.task.question + read_besides(calls, system)
        key = OTHER_KEY if self.behaviour == "other_model" else TRUE_KEY
        # "adapter_liar": names ADAPTER in its result, ran another one
        adapter = ADAPTER if self.behaviour in ("adapter", "adapter_liar") else b""
        key += OTHER_ADAPTER if self.behaviour == "adapter_liar" else adapter
        ids = generate(key, q)
        fps = fingerprints(key, q, ids)
        if self.behaviour == "tamper":
            ids[0] ^= 1
        elif self.behaviour == "tamper_last":
            ids[-1] ^= 1
        cot = "Trust me, it is 42.\nFinal answer: 42" if self.behaviour == "fabricated_cot" \
            else detok(ids)
        return ComputeDone(task_id=e.task.task_id, attempt=e.attempt, answer="42", cot=cot,
                           confidence=0.9, tokens=len(ids), compute_ms=self.compute_ms,
                           model_hash=MODEL_HASH, fingerprints=tuple(fps), fingerprint_root=b"",
                           output_ids=tuple(ids), tool_calls=calls, system_prompt=system,
                           adapter=adapter)


@dataclass
class Checker:
    machine: Verifier
    behaviour: str = "honest"
    check_ms: int = 20
    checks: list[StartCheck] = field(default_factory=list)

    def verdict(self, e: StartCheck) -> CheckDone | None:
        if self.behaviour == "silent":
            return None
        if self.behaviour in ("lazy", "framer"):
            return CheckDone(e.check_id, self.behaviour == "lazy", self.behaviour)
        ids = list(e.output_ids)
        read = e.task.question + read_besides(e.tool_calls, e.system_prompt)
        mine = fingerprints(TRUE_KEY + e.adapter, read, ids, e.chunk_tokens)
        bad = [i for i, fp in zip(e.chunk_indices, e.fingerprints, strict=True)
               if i >= len(mine) or mine[i] != fp]
        if bad:
            return CheckDone(e.check_id, False, f"chunks {bad} differ")
        if e.cot != detok(ids):
            return CheckDone(e.check_id, False, "CoT is not the detokenized output")
        return CheckDone(e.check_id, True, "")


class VerifyNet:
    def __init__(self, executors: list[str], verifiers: list[str], *,
                 verify: VerifyConfig | None = None, seed: int = 5, k: int | None = None,
                 config: AuctionConfig | None = None) -> None:
        self.now = 0
        self.seq = 0
        self.queue: list[tuple[int, int, str, object]] = []
        self.requester = ident(1)
        self.k = k if k is not None else len(executors)
        self.verify = verify or VerifyConfig(sample_rate=1.0)
        self.auction = VerifiedAuction(
            self.requester, ScoreSelector(), random.Random(seed), config or AuctionConfig(),
            verify=self.verify, verifier_candidates=self.candidates)
        self.workers: dict[str, Worker] = {}
        for i, behaviour in enumerate(executors):
            who = ident(100 + i)
            m = VerifiedExecutor(who, ExecutorConfig(models=(MODEL,)), random.Random(seed * 7 + i))
            self.workers[who.peer_id] = Worker(m, behaviour)
        self.checkers: dict[str, Checker] = {}
        for i, behaviour in enumerate(verifiers):
            who = ident(200 + i)
            hashes = frozenset() if behaviour == "blind" else frozenset({MODEL_HASH})
            self.checkers[who.peer_id] = Checker(Verifier(who, VerifierConfig(hashes)), behaviour)
        self.updates: list[TaskUpdated] = []
        self.attests: list[Attest] = []
        self.ledger: list[tuple[str, LedgerAttest]] = []
        self.emits: list[tuple[str, Emit]] = []
        self.penalties: list[tuple[str, Penalize]] = []
        self.sent: list[tuple[str, str, Message]] = []
        self.tap: Callable[[str, str, Message], Message | None] = lambda s, d, m: m

    @property
    def rq(self) -> str:
        return self.requester.peer_id

    def candidates(self, model_hash: bytes, now: int) -> list[str]:
        return list(self.checkers) if model_hash == MODEL_HASH else []

    def peer_of(self, behaviour: str) -> str:
        return next(p for p, w in self.workers.items() if w.behaviour == behaviour)

    def machine(self, peer: str) -> VerifiedAuction | VerifiedExecutor | Verifier:
        if peer == self.rq:
            return self.auction
        if peer in self.workers:
            return self.workers[peer].machine
        return self.checkers[peer].machine

    def schedule(self, at: int, dest: str, event: object) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, dest, event))

    def perform(self, src: str, effects: list[object]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.deliver(src, e.peer, e.message)
            elif isinstance(e, Publish):
                for peer in self.workers:
                    self.deliver(src, peer, e.message, topic=e.topic)
            elif isinstance(e, StartCompute):
                w = self.workers[src]
                w.started.append(e)
                if w.behaviour != "silent":
                    self.schedule(self.now + w.compute_ms, src, w.solve(e))
            elif isinstance(e, StartCheck):
                c = self.checkers[src]
                c.checks.append(e)
                done = c.verdict(e)
                if done is not None:
                    self.schedule(self.now + c.check_ms, src, done)
            elif isinstance(e, TaskUpdated):
                self.updates.append(e)
            elif isinstance(e, Attest):
                self.attests.append(e)
            elif isinstance(e, LedgerAttest):
                self.ledger.append((src, e))
            elif isinstance(e, Emit):
                self.emits.append((src, e))
            elif isinstance(e, Penalize):
                self.penalties.append((src, e))
            elif not isinstance(e, (CancelCompute, CancelCheck)):
                raise AssertionError(f"unexpected effect {e!r}")

    def deliver(self, src: str, dest: str, msg: Message, topic: str | None = None) -> None:
        tapped = self.tap(src, dest, msg)
        if tapped is None:
            return
        self.sent.append((src, dest, tapped))
        wire = decode(encode(tapped))
        self.schedule(self.now + LATENCY_MS, dest, Received(src, wire, topic))

    def inject(self, src: str, dest: str, msg: Message) -> None:
        self.schedule(self.now, dest, Received(src, decode(encode(msg))))

    def step_to(self, until: int) -> None:
        peers = [self.rq, *self.workers, *self.checkers]
        while True:
            deadlines = [(d, p) for p in peers if (d := self.machine(p).next_deadline()) is not None]
            next_tick = min(deadlines) if deadlines else None
            next_msg = self.queue[0][0] if self.queue else None
            times = [t for t in (next_msg, next_tick[0] if next_tick else None)
                     if t is not None and t <= until]
            if not times:
                self.now = until
                return
            t = min(times)
            self.now = max(self.now, t)
            if next_msg is not None and next_msg == t:
                _, _, dest, event = heapq.heappop(self.queue)
                self.perform(dest, self.machine(dest).handle(event, self.now))
            else:
                assert next_tick is not None
                peer = next_tick[1]
                self.perform(peer, self.machine(peer).handle(Tick(), self.now))

    def submit(self, deadline_ms: int = 30_000, **kw: object) -> bytes:
        task_id = digest(f"task-{self.seq}-{self.now}".encode())
        fields: dict[str, object] = {"question": f"q{self.now}: 6*7?", "answer_type": "number",
                                     "deadline_ms": deadline_ms, "k": self.k, "task_id": task_id}
        fields.update(kw)
        self.perform(self.rq, self.auction.handle(SubmitTask(**fields), self.now))  # type: ignore[arg-type]
        return task_id

    def run_task(self, deadline_ms: int = 30_000, **kw: object) -> dict[str, object]:
        tid = self.submit(deadline_ms, **kw)
        self.step_to(self.now + deadline_ms + 1)
        return self.last(tid)

    def last(self, task_id: bytes) -> dict[str, object]:
        for u in reversed(self.updates):
            if u.snapshot.task_id == task_id.hex():
                return u.snapshot.to_dict()
        raise KeyError(task_id.hex())

    def verdicts_about(self, subject: str, kind: str) -> list[tuple[str, LedgerAttest]]:
        return [(o, a) for o, a in self.ledger if a.subject == subject and a.kind.name == kind]
