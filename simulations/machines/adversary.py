"""Adversary profiles: the honest machines, with their inputs and outputs rewritten.

An adversary runs the very same protocol machine as everyone else; what it changes is what
goes in (events it fabricates or alters) and what comes out (effects it drops, alters or
repeats). :class:`Wrapped` puts a :class:`Behaviour` around a machine; every query the
workload makes (``.tasks``, ``.counters``, ...) goes through to the inner machine.

Behaviours
----------
``LazyExecutor``      skips the work: answers at once with a made-up number, confidently.
``WrongExecutor``     computes, then swaps its answer for the most common mistake.
``ColludingVoter``    all members of a group return the same wrong answer (derived from the
                      question and the group), with full confidence.
``BidSpammer``        repeats every bid it sends ``factor`` times (replays of a signed bid).
``FreeRider``         never serves relay chunks (takes, never gives back).
``SybilPraise``       a group of identities that attest each other's "completed tasks" to the
                      ledger every ``period_ms`` (reputation inflation), combined with
                      collusion on answers.
``ModelSwapper``      claims the advertised model but computes with another: its answers come
                      from a weaker skill and its results carry the other model's hash.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from crypto.hashing import digest
from protocol.machine import Send, Tick
from protocol.market.events import ComputeDone, StartCompute

if TYPE_CHECKING:
    from simulations.compute.cost import CostModel
    from simulations.node import VirtualNode

_TICK = Tick()


class Behaviour:
    """Pass-through; subclasses override what they rewrite."""

    label = "honest"

    def on_event(self, node: VirtualNode, event: object, now: int) -> list[object]:
        return [event]

    def on_effects(self, node: VirtualNode, effects: list[object], now: int) -> list[object]:
        return effects

    def deadline(self) -> int | None:
        return None

    def on_tick(self, node: VirtualNode, now: int) -> list[object]:
        """Events to feed the inner machine when ``deadline`` has passed."""
        return []


class Wrapped:
    """A machine whose inputs and outputs pass through a behaviour."""

    def __init__(self, inner: Any, node: VirtualNode, behaviour: Behaviour) -> None:
        self.inner = inner
        self.node = node
        self.behaviour = behaviour

    def handle(self, event: object, now: int) -> list[object]:
        behaviour = self.behaviour
        events: list[object]
        if isinstance(event, Tick):
            due = behaviour.deadline()
            events = behaviour.on_tick(self.node, now) if due is not None and due <= now else []
            inner_due = self.inner.next_deadline()
            if inner_due is not None and inner_due <= now:
                events.append(event)
        else:
            events = behaviour.on_event(self.node, event, now)
        effects: list[object] = []
        for ev in events:
            effects.extend(self.inner.handle(ev, now))
        return behaviour.on_effects(self.node, effects, now)

    def next_deadline(self) -> int | None:
        times = [
            t for t in (self.inner.next_deadline(), self.behaviour.deadline()) if t is not None
        ]
        return min(times) if times else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def unwrap(machine: Any) -> Any:
    while isinstance(machine, Wrapped):
        machine = machine.inner
    return machine


# ------------------------------------------------------------------ executors


class LazyExecutor(Behaviour):
    label = "lazy"

    def on_effects(self, node: VirtualNode, effects: list[object], now: int) -> list[object]:
        out: list[object] = []
        for effect in effects:
            if isinstance(effect, StartCompute):
                guess = str(node.rng.randrange(10, 10_000))
                done = ComputeDone(
                    task_id=effect.task.task_id,
                    attempt=effect.attempt,
                    answer=guess,
                    cot="",
                    confidence=0.95,
                    tokens=5,
                    compute_ms=10,
                    model_hash=_hash(effect.model),
                )
                node.swarm.loop.after(10_000, node.submit, "executor", done)
                continue
            out.append(effect)
        return out


class Liar(Protocol):
    """How an executor lies about its answers: ``rewrite`` replaces the honest result."""

    label: str

    def rewrite(self, node: VirtualNode, done: ComputeDone, question: str) -> ComputeDone: ...


class AnswerRewriter(Behaviour):
    """An executor that lies about answers the way ``liar`` does: it remembers each task's
    question when the computation starts and has ``liar`` replace the honest ``ComputeDone``."""

    def __init__(self, liar: Liar) -> None:
        self._questions: dict[bytes, str] = {}
        self.liar = liar
        self.label = liar.label

    def on_effects(self, node: VirtualNode, effects: list[object], now: int) -> list[object]:
        for effect in effects:
            if isinstance(effect, StartCompute):
                self._questions[effect.task.task_id] = effect.task.question
        return effects

    def on_event(self, node: VirtualNode, event: object, now: int) -> list[object]:
        if isinstance(event, ComputeDone):
            return [self.liar.rewrite(node, event, self._questions.pop(event.task_id, ""))]
        return [event]


class WrongExecutor:
    label = "wrong"

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def rewrite(self, node: VirtualNode, done: ComputeDone, question: str) -> ComputeDone:
        q = self.cost.question(question)
        if q is None:
            return done
        return replace(done, answer=q.distractors[0], confidence=0.99)


class ColludingVoter:
    label = "colluder"

    def __init__(self, group: str) -> None:
        self.group = group

    def rewrite(self, node: VirtualNode, done: ComputeDone, question: str) -> ComputeDone:
        h = digest(f"{self.group}/{question}".encode(), person=b"sim-collude")
        agreed = str(10 + int.from_bytes(h[:4], "big") % 9_990)
        return replace(done, answer=agreed, confidence=1.0)


@dataclass
class BidSpammer(Behaviour):
    factor: int = 20
    label = "bid_spammer"

    def on_effects(self, node: VirtualNode, effects: list[object], now: int) -> list[object]:
        out: list[object] = []
        for effect in effects:
            out.append(effect)
            if isinstance(effect, Send) and type(effect.message).__name__ == "Bid":
                out.extend([effect] * (self.factor - 1))
        return out


class ModelSwapper:
    """Computes with a cheaper model than it advertises (answers from ``skill``)."""

    label = "model_swapper"

    def __init__(self, cost: CostModel, skill: float, other_model: str = "cheap-model") -> None:
        self.cost = cost
        self.skill = skill
        self.other_model = other_model

    def rewrite(self, node: VirtualNode, done: ComputeDone, question: str) -> ComputeDone:
        from simulations.compute.cost import ExecutorProfile

        q = self.cost.question(question)
        profile = ExecutorProfile(device=node.profile.device, skill={"*": self.skill})
        answer, confidence = self.cost.answer(profile, q, node.rng)
        return replace(done, answer=answer, confidence=confidence)


# ------------------------------------------------------------------ relay


class FreeRider(Behaviour):
    label = "free_rider"

    def on_effects(self, node: VirtualNode, effects: list[object], now: int) -> list[object]:
        kept = [e for e in effects if type(e).__name__ != "ServeChunk"]
        dropped = len(effects) - len(kept)
        if dropped:
            node.swarm.metrics.count("free_rider_refused", dropped)
        return kept


# ------------------------------------------------------------------ ledger


class SybilPraise(Behaviour):
    """Attest every other member of the group as having completed a task, periodically."""

    label = "sybil"

    def __init__(self, members: list[str], period_ms: int, rng: random.Random) -> None:
        self.members = members
        self.period_ms = period_ms
        self.rng = rng
        self._next: int | None = None

    def deadline(self) -> int | None:
        return self._next

    def on_event(self, node: VirtualNode, event: object, now: int) -> list[object]:
        if self._next is None:
            self._next = now + self.period_ms
        return [event]

    def on_tick(self, node: VirtualNode, now: int) -> list[object]:
        from protocol.ledger.machine import Attest
        from protocol.ledger.records import AttestationKind

        self._next = now + self.period_ms
        return [
            Attest(
                subject=peer,
                object_id=self.rng.randbytes(32),
                kind=AttestationKind.TASK_COMPLETED,
                outcome="completed",
            )
            for peer in self.members
            if peer != node.peer_id
        ]


def _hash(model: str) -> bytes:
    return digest(model.encode(), person=b"sim-weights")
