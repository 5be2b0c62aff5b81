"""Who could bid on a task, by the ledger: the count that closes a bid window early."""

from __future__ import annotations

from protocol.ledger.records import Role
from protocol.machine import Received
from protocol.market.bidders import possible_bidders
from protocol.market.messages import Requirement, TaskSpec
from protocol.market.state import OpenTask, TaskPhase
from tests.protocol.ledger_net import T0, gossip, identity, machine, offer, record

A, B, C, D = identity(1), identity(2), identity(3), identity(4)


def task(model: str = "", family: str = "", allow_self: bool = False) -> OpenTask:
    spec = TaskSpec(task_id=b"\x01" * 16, requester=D.peer_id, question="1+1?",
                    answer_type="number", choices=(),
                    requirement=Requirement(model=model, family=family, min_context=0),
                    k=3, max_price=1.0, max_tokens=32)
    return OpenTask(spec=spec, allow_self=allow_self, phase=TaskPhase.BIDDING,
                    created_at_ms=T0, deadline_at_ms=T0 + 10_000)


def test_counts_live_executors_whose_model_fits_by_the_executors_rule() -> None:
    m = machine(3)  # the view's own peer is identity(3): C
    qwen = offer(name="qwen-7b", family="qwen")
    llama = offer(name="SmolLM2", family="llama")
    m.handle(Received(identity(9).peer_id, gossip([
        record(A, 1, models=(qwen,), roles=(Role.EXECUTOR,)),
        record(B, 1, models=(llama, qwen), roles=(Role.EXECUTOR,)),
        record(C, 1, models=(qwen,), roles=(Role.EXECUTOR,)),
        record(D, 1, models=(qwen,), roles=(Role.RELAY,)),  # serves, but does not execute
    ]), "ledger"), T0)
    view = m.view
    assert possible_bidders(view, task(), T0) == 2  # any model; not ourselves
    assert possible_bidders(view, task(allow_self=True), T0) == 3
    assert possible_bidders(view, task(model="smollm2"), T0) == 1  # names match in any case
    assert possible_bidders(view, task(family="qwen"), T0) == 2
    assert possible_bidders(view, task(model="nope"), T0) == 0
