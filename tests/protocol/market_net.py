"""A tiny deterministic harness for task-market tests: one Auction, several Executors.

Messages are delivered through the wire codec (encode, then decode) with a fixed latency on a
virtual clock, computations finish after a per-executor delay with a per-executor answer, and
machines are ticked at their deadlines. Behaviours: "ok" answers, "silent" accepts and never
answers, "dead" receives nothing once killed. ``tap`` sees every delivered message and may
replace it (None drops it), for fault injection.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from crypto.keys import Identity
from protocol.agents.cards import AgentCard
from protocol.agents.wire import AgentMatch, no_cards
from protocol.codec import Message, decode, encode
from protocol.machine import Emit, PeerDisconnected, Penalize, Publish, Received, Send, Tick
from protocol.market.auction import Attest, Auction, AuctionConfig, AuctionOptions, TaskUpdated
from protocol.market.executor import (
    CancelCompute,
    ComputeDone,
    Executor,
    ExecutorConfig,
    ServedModel,
    StartCompute,
)
from protocol.market.selection import ScoreSelector, Selector

LATENCY_MS = 2
MODEL = ServedModel(name="smollm2-135m", family="smollm2", context=2048,
                    model_hash=b"\x11" * 32, tokens_per_s=100.0, price_per_1k=0.0)


def ident(n: int) -> Identity:
    return Identity.from_seed(bytes([n]) * 32)


@dataclass
class Worker:
    machine: Executor
    answer: str = "42"
    confidence: float = 0.9
    compute_ms: int = 100
    behaviour: str = "ok"  # ok | silent | dead
    started: list[StartCompute] = field(default_factory=list)


class MarketNet:
    def __init__(self, n_exec: int = 3, *, config: AuctionConfig | None = None,
                 selector: Selector | None = None, slots: int = 1,
                 reputation: Callable[[str], float] = lambda p: 0.5,
                 model: ServedModel = MODEL, agent_match: AgentMatch = no_cards,
                 agents: tuple[tuple[AgentCard, ...], ...] = ()) -> None:
        """``agents[i]``: the cards executor ``i`` hosts (none when absent)."""
        self.now = 0
        self.seq = 0
        self.queue: list[tuple[int, int, str, object]] = []
        self.requester = ident(1)
        self.auction = Auction(self.requester, selector or ScoreSelector(),
                               random.Random(5), config or AuctionConfig(),
                               AuctionOptions(reputation=reputation, agent_match=agent_match))
        self.workers: dict[str, Worker] = {}
        for i in range(n_exec):
            who = ident(10 + i)
            cfg = ExecutorConfig(models=(model,), slots=slots,
                                 agents=agents[i] if i < len(agents) else ())
            self.workers[who.peer_id] = Worker(Executor(who, cfg))
        self.updates: list[TaskUpdated] = []
        self.attests: list[Attest] = []
        self.emits: list[Emit] = []
        self.penalties: list[Penalize] = []
        self.sent: list[tuple[str, str, Message]] = []
        self.tap: Callable[[str, str, Message], Message | None] = lambda s, d, m: m

    @property
    def rq(self) -> str:
        return self.requester.peer_id

    def peers(self) -> list[str]:
        return list(self.workers)

    def schedule(self, at: int, dest: str, event: object) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, dest, event))

    def machine(self, peer: str) -> Auction | Executor:
        return self.auction if peer == self.rq else self.workers[peer].machine

    def perform(self, src: str, effects: list[object]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.deliver(src, e.peer, e.message)
            elif isinstance(e, Publish):
                for peer in self.workers:
                    if peer != src:
                        self.deliver(src, peer, e.message, topic=e.topic)
            elif isinstance(e, StartCompute):
                w = self.workers[src]
                w.started.append(e)
                if w.behaviour == "ok":
                    done = ComputeDone(task_id=e.task.task_id, attempt=e.attempt, answer=w.answer,
                                       cot=f"think {w.answer}", confidence=w.confidence, tokens=17,
                                       compute_ms=w.compute_ms, model_hash=MODEL.model_hash)
                    self.schedule(self.now + w.compute_ms, src, done)
            elif isinstance(e, TaskUpdated):
                self.updates.append(e)
            elif isinstance(e, Attest):
                self.attests.append(e)
            elif isinstance(e, Emit):
                self.emits.append(e)
            elif isinstance(e, Penalize):
                self.penalties.append(e)
            elif isinstance(e, CancelCompute):
                pass
            else:
                raise AssertionError(f"unexpected effect {e!r}")

    def deliver(self, src: str, dest: str, msg: Message, topic: str | None = None) -> None:
        tapped = self.tap(src, dest, msg)
        if tapped is None:
            return
        self.sent.append((src, dest, tapped))
        wire = decode(encode(tapped))  # every delivery crosses the real codec
        self.schedule(self.now + LATENCY_MS, dest, Received(src, wire, topic))

    def inject(self, src: str, dest: str, msg: Message, at: int | None = None) -> None:
        """Deliver ``msg`` as if ``src`` sent it (bypassing the tap)."""
        self.schedule(self.now if at is None else at, dest, Received(src, msg))

    def kill(self, peer: str) -> None:
        self.workers[peer].behaviour = "dead"
        self.schedule(self.now, self.rq, PeerDisconnected(peer))

    def step_to(self, until: int) -> None:
        while True:
            live = [self.rq, *(p for p, w in self.workers.items() if w.behaviour != "dead")]
            deadlines = [(d, p) for p in live if (d := self.machine(p).next_deadline()) is not None]
            next_tick = min(deadlines) if deadlines else None
            next_msg = self.queue[0][0] if self.queue else None
            candidates = [t for t in (next_msg, next_tick[0] if next_tick else None)
                          if t is not None and t <= until]
            if not candidates:
                self.now = until
                return
            t = min(candidates)
            self.now = max(self.now, t)
            if next_msg is not None and next_msg == t:
                _, _, dest, event = heapq.heappop(self.queue)
                if dest != self.rq and (dest not in self.workers
                                        or self.workers[dest].behaviour == "dead"):
                    continue
                self.perform(dest, self.machine(dest).handle(event, self.now))
            else:
                assert next_tick is not None
                peer = next_tick[1]
                self.perform(peer, self.machine(peer).handle(Tick(), self.now))

    def submit(self, **kw: object) -> bytes:
        from protocol.market.auction import SubmitTask

        fields: dict[str, object] = {"question": "6*7?", "answer_type": "number",
                                     "deadline_ms": 30_000, "k": 3}
        fields.update(kw)
        effects = self.auction.handle(SubmitTask(**fields), self.now)  # type: ignore[arg-type]
        self.perform(self.rq, effects)
        task_id = next(iter(self.auction.tasks.keys().__reversed__()))
        return task_id

    def last(self, task_id: bytes) -> dict[str, object]:
        for u in reversed(self.updates):
            if u.snapshot.task_id == task_id.hex():
                return u.snapshot.to_dict()
        raise KeyError(task_id.hex())
