"""An executor machine and the messages a requester sends it, for the executor and latency
tests: a beacon, a task spec, an assignment, and the effects of one kind."""

from __future__ import annotations

from protocol.codec import decode, encode
from protocol.envelopes import seal
from protocol.machine import Received, Send
from protocol.market.executor import Executor, ExecutorConfig
from protocol.market.messages import (
    ASSIGN_DOMAIN,
    BEACON_DOMAIN,
    BEACON_TOPIC,
    Assign,
    AssignBody,
    Beacon,
    BeaconBody,
    Requirement,
    TaskSpec,
)
from tests.protocol.market_net import MODEL, ident

REQ = ident(1)
ME = ident(2)
TID = b"\x07" * 32


def executor(**kw: object) -> Executor:
    cfg = ExecutorConfig(models=(MODEL,), **kw)  # type: ignore[arg-type]
    return Executor(ME, cfg)


def beacon(task_id: bytes = TID, round_: int = 0, signer=REQ, requester=None,  # type: ignore[no-untyped-def]
           model: str = "smollm2-135m", max_price: float = 1.0, max_tokens: int = 256,
           deadline_ms: int = 60_000) -> Received:
    body = BeaconBody(task_id=task_id, requester=requester or REQ.peer_id, round=round_,
                      requirement=Requirement(model=model, family="", min_context=0), wanted=1,
                      max_price=max_price, max_tokens=max_tokens, bid_window_ms=1000,
                      deadline_ms=deadline_ms, allow_self=False)
    msg = decode(encode(Beacon(envelope=seal(signer, BEACON_DOMAIN, body))))
    return Received(REQ.peer_id, msg, BEACON_TOPIC)


def spec(task_id: bytes = TID, question: str = "2+2?", max_tokens: int = 256) -> TaskSpec:
    return TaskSpec(task_id=task_id, requester=REQ.peer_id, question=question,
                    answer_type="number", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=max_tokens)


def assign(task: TaskSpec | None = None, executor_peer: str | None = None, signer=REQ,  # type: ignore[no-untyped-def]
           sender: str | None = None, attempt: int = 0, deadline_ms: int = 5_000,
           model: str = MODEL.name, stream: bool = True) -> Received:
    body = AssignBody(task=task or spec(), executor=executor_peer or ME.peer_id,
                      attempt=attempt, round=0, model=model, deadline_ms=deadline_ms,
                      stream=stream)
    return Received(sender or REQ.peer_id, Assign(envelope=seal(signer, ASSIGN_DOMAIN, body)))


def sends(effects: list[object], kind: type) -> list:  # type: ignore[type-arg]
    return [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, kind)]
