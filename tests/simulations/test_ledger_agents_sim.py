"""Agent cards in the simulator's ledger: the same machine spreads them to every virtual node,
a restarted node restores them from its store, and a replaced list replaces them everywhere."""

from __future__ import annotations

import random

from protocol.agents.cards import AgentCard
from protocol.ledger.machine import LedgerConfig, SetAgents
from simulations.machines.ledger import AGENTS, NAME, ledger_of, ledger_spec
from simulations.network import LatencyModel
from simulations.node import VirtualNode
from simulations.swarm import Swarm


def agent(name: str, skill: str) -> AgentCard:
    return AgentCard(name=name, description=f"Good at {skill}.", skills=(skill,), model=None,
                     adapter=None, tools=(), price_per_1k_tokens=0.1, embedding=b"",
                     embedding_scale=0.0, embedder_hash=b"")


def agents_of(node: VirtualNode) -> tuple[AgentCard, ...] | None:
    return (agent(f"n{node.index}", "math"),) if node.index % 2 == 0 else None


def make(seed: int, n: int) -> Swarm:
    swarm = Swarm(seed, latency=LatencyModel("uniform", 5.0, 50.0), wire_bytes=True)
    spec = ledger_spec("sim", LedgerConfig(anti_entropy_ms=5_000), lambda node: None,
                       agents_of=agents_of)
    nodes = [swarm.add_node((spec,)) for _ in range(n)]
    rng = random.Random(seed)
    for node in nodes:
        swarm.start(node)
    for node in nodes:
        swarm.connect_random(node, 3, rng)
    return swarm


def hosts(node: VirtualNode, now: int) -> dict[str, tuple[str, ...]]:
    return {h.record.peer_id: tuple(c.name for c in h.record.cards)
            for h in ledger_of(node).view.agent_records(now)}


def test_cards_reach_every_node_restore_after_a_crash_and_replace_by_seq() -> None:
    swarm = make(7, 16)
    swarm.run(20_000)
    now = swarm.machine_now_ms
    expected = {n.peer_id: (f"n{n.index}",) for n in swarm.nodes if n.index % 2 == 0}
    assert all(hosts(n, now) == expected for n in swarm.nodes)
    victim = swarm.nodes[3]
    assert len(victim.store[AGENTS]) == 8
    swarm.crash(victim)
    swarm.start(victim)
    assert hosts(victim, swarm.machine_now_ms) == expected  # from its store, no peers yet
    publisher = swarm.nodes[0]
    publisher.submit(NAME, SetAgents((agent("n0", "math"), agent("n0b", "poetry"))))
    swarm.connect_random(victim, 3, random.Random(0))
    swarm.run(40_000)
    now = swarm.machine_now_ms
    expected[publisher.peer_id] = ("n0", "n0b")
    assert all(hosts(n, now) == expected for n in swarm.nodes)
