"""The daemon's services and the simulator's virtual nodes make the same protocol decisions.

Each scenario is driven once through the daemon's service layer (the node services with a
stand-in context: no libp2p, as tests/node/test_tasks_service.py builds them) and once through
the simulator's machine hosts (simulations/machines/), and what each produces is compared:

* task market: the ``Attest`` effects of a real auction run (an executor agreeing with the
  vote, one answering wrong, one silent) become the same ledger attestations on both sides;
* verification: both sides build the requester's ``VerifiedAuction`` and the executor's
  ``VerifiedExecutor``; over one ledger view they choose the same verifier candidates, exclude
  the same convicted peer, and wait the same Terms grace; the daemon's tasks service and the
  simulator's requester close a bid window early the same way, once every executor the ledger
  knows has bid (``possible_bidders``, given to the one constructor on both sides);
* plan mode: the tasks service's ``PlanningRequester`` and the simulator's (simulations/agents/
  plan_world.py), fed the same agents, plans and step answers, produce the same plans, steps
  run by the same executors and the same vote;
* relay: the same stored chunks, corrupt chunk and completed version give the same
  ``RELAY_SERVED`` / ``RELAY_BAD_CHUNK`` attestations.

Each comparison also pins the expected decision, so a side that decides nothing cannot pass.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from crypto.keys import Identity
from node.market.requester import TasksSection, TasksService
from node.relay.service import RelaySection, RelayService
from node.sections import fed_config
from node.verification.service import VerifySection, executor_machine, requester_machine
from protocol.envelopes import seal
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.machine import LedgerConfig
from protocol.ledger.records import AttestationKind, Role
from protocol.machine import Received, Send
from protocol.market.auction import Auction, AuctionOptions
from protocol.market.events import AuctionConfig, SubmitTask
from protocol.market.executor import ExecutorConfig, ServedModel
from protocol.market.messages import BID_DOMAIN, Assign, Bid, BidBody
from protocol.market.selection import ScoreSelector
from protocol.relay.events import AttestBadChunk, StoreChunk, VersionComplete
from protocol.relay.manifest import chunk_hash, make_body, sign_manifest
from protocol.verification.executor import DEFAULT_TERMS_GRACE_MS
from protocol.verification.requester import VerifiedAuction
from protocol.verification.state import VerifyConfig
from simulations.compute.cost import DEVICES, model_hash
from simulations.machines.ledger import ledger_spec
from simulations.machines.market import AUCTION, auction_spec
from simulations.machines.relay import Published, relay_spec
from simulations.machines.verification import verified_auction_spec, verified_executor_spec
from simulations.network import LatencyModel
from simulations.node import MachineSpec, VirtualNode
from simulations.swarm import Swarm
from simulations.workloads.common import MODEL_NAME, capability
from tests.protocol.market_net import MarketNet, ident

DEVICE = DEVICES["rtx3090"]


class _Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def daemon_context(submitted: list[tuple[str, object]], **extra: Any) -> SimpleNamespace:
    """A NodeContext stand-in whose ``submit`` records what the service hands other services."""

    async def submit(name: str, event: object) -> None:
        submitted.append((name, event))

    fields: dict[str, Any] = {
        "identity": ident(1), "network_id": "t", "data_dir": Path("."), "db": None,
        "transport": None, "log": _Log(), "rng": random.Random(3), "clock": lambda: 0,
        "submit": submit, "services": {"ledger": SimpleNamespace(machine=None)},
        "config": SimpleNamespace(section=lambda name: None, sections={}),
    }
    fields.update(extra)
    return SimpleNamespace(**fields)


class LedgerRecorder:
    """Stands in for a node's ledger machine: records every command it is given."""

    def __init__(self) -> None:
        self.commands: list[object] = []

    def handle(self, event: object, now: int) -> list[object]:
        self.commands.append(event)
        return []

    def next_deadline(self) -> int | None:
        return None


def recorded_node(swarm: Swarm, spec: MachineSpec) -> tuple[VirtualNode, LedgerRecorder]:
    """A started virtual node hosting ``spec`` and a ledger that records its commands."""
    recorder = LedgerRecorder()
    node = swarm.add_node((spec, MachineSpec(name="ledger", build=lambda node: recorder)))
    swarm.start(node)
    return node, recorder


# ------------------------------------------------------------------ task market


def market_attests() -> list[object]:
    """A real auction: two executors agree, one answers wrong, one never answers."""
    net = MarketNet(4)
    workers = list(net.workers.values())
    workers[2].answer = "41"
    workers[3].behaviour = "silent"
    net.submit(k=4, deadline_ms=20_000)
    net.step_to(60_000)
    return list(net.attests)


def test_a_tasks_outcomes_yield_the_same_attestations_in_daemon_and_simulator() -> None:
    attests = market_attests()
    submitted: list[tuple[str, object]] = []
    ctx = daemon_context(submitted,
                         config=SimpleNamespace(section=lambda name: TasksSection()))
    service = TasksService(ctx)  # type: ignore[arg-type]
    for effect in attests:
        trio.run(service.perform, effect)
    daemon = [event for name, event in submitted if name == "ledger"]

    spec = auction_spec(lambda node: ScoreSelector(), AuctionConfig())
    node, ledger = recorded_node(Swarm(1), spec)
    for effect in attests:
        spec.performers[type(effect)](node, AUCTION, effect)
    simulated = ledger.commands

    assert daemon == simulated
    kinds = sorted(a.kind.value for a in daemon if isinstance(a, LedgerAttest))
    assert kinds == ["task_completed", "task_completed", "task_failed", "task_timed_out"]


# ------------------------------------------------------------------ verification


def ledger_swarm() -> tuple[Swarm, VirtualNode, dict[str, int]]:
    """Node 0 asks; 1-3 verify the model, 4 verifies another, 5 only executes. Node 0 has
    praised 1 and 2, and both convicted 3: the ledger shows 3 convicted by reputable peers."""

    def spec_of(node: VirtualNode) -> Any:
        if node.index == 0:
            return None
        roles = (Role.EXECUTOR,) if node.index == 5 else (Role.EXECUTOR, Role.VERIFIER)
        spec = capability(node, DEVICE, roles=roles)
        if node.index == 4:
            other = dataclasses.replace(spec.models[0], weights_hash=model_hash("another model"))
            spec = dataclasses.replace(spec, models=(other,))
        return spec

    led = ledger_spec("t", LedgerConfig(anti_entropy_ms=5_000), spec_of)
    swarm = Swarm(7, latency=LatencyModel("uniform", 1.0, 5.0))
    nodes = [swarm.add_node((led,)) for _ in range(6)]
    for node in nodes:
        swarm.start(node)
    for a in nodes:
        for b in nodes:
            if a.index < b.index:
                swarm.connect(a, b)
    swarm.run(5_000)
    peers = {node.peer_id: node.index for node in nodes}
    for subject in (1, 2):
        for n in range(5):
            nodes[0].submit("ledger", LedgerAttest(
                subject=nodes[subject].peer_id, object_id=bytes([subject, n]) * 16,
                kind=AttestationKind.TASK_COMPLETED, outcome="completed"))
    for observer in (1, 2):
        nodes[observer].submit("ledger", LedgerAttest(
            subject=nodes[3].peer_id, object_id=bytes([9, observer]) * 16,
            kind=AttestationKind.VERIFICATION_FAILED, outcome="fail",
            evidence_hash=bytes([observer]) * 32))
    swarm.run(20_000)
    return swarm, nodes[0], peers


def test_verifier_choice_exclusion_and_grace_are_the_same_in_daemon_and_simulator() -> None:
    swarm, asker, peers = ledger_swarm()
    now = swarm.machine_now_ms
    verify = VerifySection(enabled=True)
    view = asker.slots["ledger"].machine.view
    ctx = daemon_context([], identity=asker.identity,
                         services={"ledger": SimpleNamespace(machine=SimpleNamespace(view=view))},
                         config=SimpleNamespace(section=lambda name: verify))
    daemon = requester_machine(ctx, ScoreSelector(), AuctionConfig(),  # type: ignore[arg-type]
                               AuctionOptions())
    spec = verified_auction_spec(lambda node: ScoreSelector(), AuctionConfig(),
                                 verify.verify_config())
    simulated = spec.build(asker)

    mh = model_hash(MODEL_NAME)
    chosen = daemon.verifier_candidates(mh, now)  # type: ignore[attr-defined]
    assert chosen == simulated.verifier_candidates(mh, now)
    assert sorted(peers[p] for p in chosen) == [1, 2, 3]
    excluded = {peers[p] for p in peers if daemon.excluded(p, now)}  # type: ignore[attr-defined]
    assert excluded == {peers[p] for p in peers if simulated.excluded(p, now)} == {3}

    served = ServedModel(MODEL_NAME, "sim", 8192, mh, DEVICE.tokens_per_s, 0.0)
    config = ExecutorConfig(models=(served,))
    exec_daemon = executor_machine(ctx, config)  # type: ignore[arg-type]
    exec_sim = verified_executor_spec(lambda node: config, None).build(asker)  # type: ignore[arg-type]
    assert exec_daemon.terms_grace_ms == exec_sim.terms_grace_ms == DEFAULT_TERMS_GRACE_MS == 500  # type: ignore[attr-defined]
    assert VerifyConfig() == verify.verify_config()


TASK_ID = bytes(range(32))


def bid_from(node: VirtualNode) -> Bid:
    """``node``'s signed bid on ``TASK_ID``'s first round, for the swarm's model."""
    body = BidBody(task_id=TASK_ID, round=0, bidder=node.peer_id, model=MODEL_NAME,
                   model_hash=model_hash(MODEL_NAME), match_score=1.0, price=0.0,
                   est_latency_ms=1_000, load=0.0, free_slots=2, hold_ms=30_000)
    return Bid(envelope=seal(node.identity, BID_DOMAIN, body))


def assigned_after_each_bid(machine: Any, bidders: list[VirtualNode], now: int) -> list[list[str]]:
    """Submit a task wanting one executor per bidder, then one bid from each, 1 ms apart:
    the peers assigned right after each bid (the window closed then when any is)."""
    machine.handle(SubmitTask(question="2+2?", answer_type="number", deadline_ms=60_000,
                              k=len(bidders), model=MODEL_NAME, task_id=TASK_ID), now)
    out = []
    for i, node in enumerate(bidders, start=1):
        effects = machine.handle(Received(node.peer_id, bid_from(node)), now + i)
        out.append(sorted(e.peer for e in effects
                          if isinstance(e, Send) and isinstance(e.message, Assign)))
    return out


def test_the_bid_window_closes_early_the_same_way_in_daemon_and_simulator() -> None:
    swarm, asker, peers = ledger_swarm()
    now = swarm.machine_now_ms
    view = asker.slots["ledger"].machine.view
    verify = VerifySection(enabled=True)
    sections = {"tasks": TasksSection(), "verify": verify}
    ctx = daemon_context([], identity=asker.identity, clock=lambda: now,
                         services={"ledger": SimpleNamespace(machine=SimpleNamespace(view=view))},
                         config=SimpleNamespace(section=sections.__getitem__))
    daemon = TasksService(ctx).auction  # type: ignore[arg-type]
    config = fed_config(TasksSection())
    simulated = verified_auction_spec(lambda node: ScoreSelector(), config,
                                      verify.verify_config()).build(asker)
    assert isinstance(daemon, VerifiedAuction) and isinstance(simulated, VerifiedAuction)

    # the ledger knows five executors of the model (nodes 1-5): with the fifth bid every one
    # has bid, though the wanted count (five) plus a spare is not in
    bidders = sorted((n for n in swarm.nodes if n.index in (1, 2, 3, 4, 5)), key=lambda n: n.index)
    assert config.spare_bids >= 1
    on_daemon = assigned_after_each_bid(daemon, bidders, now)
    on_simulator = assigned_after_each_bid(simulated, bidders, now)
    assert on_daemon == on_simulator
    # closed at the fifth bid, not before; node 3, whom the ledger shows convicted, not picked
    assert on_daemon[:4] == [[], [], [], []]
    assert sorted(peers[p] for p in on_daemon[4]) == [1, 2, 4, 5]
    assert daemon.counters["auctions_closed"] == simulated.counters["auctions_closed"] == 1
    # an auction that is not told who could bid waits past the fifth bid (close_grace_ms)
    blind = Auction(asker.identity, ScoreSelector(), random.Random(1), config)
    assert assigned_after_each_bid(blind, bidders, now) == [[], [], [], [], []]


def test_a_bid_on_a_need_is_matched_from_the_ledgers_cards_the_same_way() -> None:
    """A task that names a need (a skill): each side matches a bid from the bidder's agent
    card in its ledger, through the ``agent_match`` each gives the one constructor, never
    from the bid's claimed match; a bid whose agent the ledger holds no card for is refused
    (and its slot released) on both sides alike."""
    swarm, asker, peers = ledger_swarm()
    now = swarm.machine_now_ms
    view = asker.slots["ledger"].machine.view
    sections = {"tasks": TasksSection(), "verify": VerifySection(enabled=True)}
    ctx = daemon_context([], identity=asker.identity, clock=lambda: now,
                         services={"ledger": SimpleNamespace(machine=SimpleNamespace(view=view))},
                         config=SimpleNamespace(section=sections.__getitem__))
    daemon = TasksService(ctx).auction  # type: ignore[arg-type]
    simulated = verified_auction_spec(lambda node: ScoreSelector(), fed_config(TasksSection()),
                                      VerifySection(enabled=True).verify_config()).build(asker)
    bidder = next(n for n in swarm.nodes if n.index == 1)
    outcomes = []
    for machine in (daemon, simulated):
        machine.handle(SubmitTask(question="2+2?", answer_type="number", deadline_ms=60_000,
                                  k=1, skills=("arithmetic",), task_id=TASK_ID), now)
        effects = machine.handle(Received(bidder.peer_id, bid_from(bidder)), now + 1)
        outcomes.append((machine.counters.get("bids_rejected.no_card"),
                         [type(e.message).__name__ for e in effects if isinstance(e, Send)]))
    assert outcomes[0] == outcomes[1] == (1, ["Cancel"])


# ------------------------------------------------------------------ relay


def relay_scenario() -> tuple[Any, list[object]]:
    """A 4-chunk version: source A stores chunks 0-2, B chunk 3 after a corrupt chunk 1."""
    publisher, a, b = ident(40), ident(41), ident(42)
    chunks = [bytes([i]) * 4096 for i in range(4)]
    hashes = [chunk_hash(c) for c in chunks]
    # the daemon's node (ident 43) is a recipient: a node plans only versions it is in
    body = make_body(name="w", version=1, chunk_size=4096, chunk_hashes=hashes,
                     total_size=4 * 4096, recipients=[(ident(43).peer_id, 0)])
    manifest = sign_manifest(publisher, body)
    effects: list[object] = [
        StoreChunk(a.peer_id, manifest.id, 0),
        AttestBadChunk(b.peer_id, manifest.id, 1, hashes[1], chunk_hash(b"bad")),
        StoreChunk(a.peer_id, manifest.id, 1),
        StoreChunk(a.peer_id, manifest.id, 2),
        StoreChunk(b.peer_id, manifest.id, 3),
        VersionComplete(manifest),
    ]
    return (manifest, chunks, publisher, a, b), effects


def daemon_relay(tmp_path: Path, scenario: Any, effects: list[object]) -> list[object]:
    manifest, chunks, publisher, *_ = scenario
    submitted: list[tuple[str, object]] = []
    ctx = daemon_context(submitted, identity=ident(43), data_dir=tmp_path,
                         config=SimpleNamespace(sections={"relay": RelaySection()}))
    service = RelayService(ctx)  # type: ignore[arg-type]
    service.machine.handle(Received(publisher.peer_id, manifest.message), 0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            for effect in effects:
                if isinstance(effect, StoreChunk):  # the chunk's bytes arrived and were checked
                    writer = service.store.writer(len(chunks[effect.index]))
                    writer.write(chunks[effect.index])
                    service.pending[(effect.peer, effect.manifest_id, effect.index)] = writer
                await service.perform(effect)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return [event for name, event in submitted if name == "ledger"]


def simulated_relay(scenario: Any, effects: list[object]) -> list[object]:
    spec = relay_spec(max_fanout=2, window=4, published=Published())
    node, ledger = recorded_node(Swarm(1), spec)
    for effect in effects:
        if isinstance(effect, StoreChunk):  # the chunk's digest arrived and was checked
            arrived = node.store.setdefault("relay.arrived", {})
            arrived[(effect.manifest_id, effect.index)] = scenario[0].chunk_hashes[effect.index]
        spec.performers[type(effect)](node, spec.name, effect)
    return ledger.commands


def _in_order(attestations: list[object]) -> list[LedgerAttest]:
    """The daemon submits attestations from tasks it spawns, in whatever order trio runs
    them; which attestations a relay yields is the decision compared, not that order."""
    atts = [a for a in attestations if isinstance(a, LedgerAttest)]
    assert len(atts) == len(attestations)
    return sorted(atts, key=lambda a: (a.kind.value, a.subject))


def test_a_relay_yields_the_same_attestations_in_daemon_and_simulator(tmp_path: Path) -> None:
    scenario, effects = relay_scenario()
    daemon = _in_order(daemon_relay(tmp_path, scenario, effects))
    simulated = _in_order(simulated_relay(scenario, effects))
    assert daemon == simulated
    manifest, _, _, a, b = scenario
    expected = [
        LedgerAttest(subject=b.peer_id, object_id=manifest.id,
                     kind=AttestationKind.RELAY_BAD_CHUNK, evidence_hash=chunk_hash(b"bad"),
                     amount=1),
        LedgerAttest(subject=a.peer_id, object_id=manifest.id,
                     kind=AttestationKind.RELAY_SERVED, amount=3),
        LedgerAttest(subject=b.peer_id, object_id=manifest.id,
                     kind=AttestationKind.RELAY_SERVED, amount=1),
    ]
    assert daemon == _in_order(list(expected))


# ------------------------------------------------------------------ plan mode


def daemon_plan_requester(cfg: Any, agents: list[Any]) -> Any:
    """The tasks service's ``PlanningRequester`` as TasksService builds it, with the
    simulator's identity, seed and the agents' cards (its ledger's agent host)."""
    from simulations.agents.plans import cards_of

    cards = cards_of(agents)
    sections = {"tasks": TasksSection()}
    ctx = daemon_context([], identity=Identity.from_seed(b"R" * 32),
                         rng=random.Random(cfg.seed),
                         services={"ledger": SimpleNamespace(
                             machine=None, agents=SimpleNamespace(matchable=cards.get))},
                         config=SimpleNamespace(section=sections.get))
    return TasksService(ctx).machine  # type: ignore[arg-type]


def _plan_rows(final: dict[str, Any]) -> list[Any]:
    return [(p["planner"], p["state"], p["answer"], [
        (s["instruction"], s["requirement"], s["agent"], s["executor"], s["output"],
         s["peers_tried"]) for s in p["steps"]]) for p in final["plans"]]


def test_plans_are_the_same_in_daemon_and_simulator() -> None:
    """The same small workload (same agents, same plans and step answers, same seed) through
    the daemon's PlanningRequester and the simulator's: the same plans, the same executors for
    each step, the same vote."""
    from models.evalset import load_evalset
    from models.planset import PLANSET_PATH
    from simulations.agents.plans import PlansConfig, ask_all, build_world

    cfg = PlansConfig(seed=5, silent_rate=0.2, invalid_rate=0.3)
    items = load_evalset(PLANSET_PATH)[:3]
    questions = [(it.id, it.problem.question) for it in items]
    sim_world, agents = build_world(cfg, know_bidders=False)
    daemon_world, _ = build_world(cfg, daemon_plan_requester(cfg, agents))
    assert daemon_world.requester.pipeline.config == sim_world.requester.pipeline.config
    on_daemon, on_simulator = ask_all(daemon_world, questions), ask_all(sim_world, questions)
    for d, s in zip(on_daemon, on_simulator, strict=True):
        assert _plan_rows(d) == _plan_rows(s)
        assert (d["answer"], d["votes"]) == (s["answer"], s["votes"])
    assert daemon_world.requester.pipeline.counters == sim_world.requester.pipeline.counters
    assert daemon_world.requester.counters == sim_world.requester.counters
    # the workload did something: plans ran and were voted, some replanned or rerouted
    assert all(f["phase"] == "done" and f["plans"] for f in on_daemon)
    counters = sim_world.requester.pipeline.counters
    assert counters["plans_valid"] >= 3 and counters.get("replans", 0) >= 1
