"""Every protocol machine under fuzzing: hostile frames in, effects or the documented errors out.

Each scenario runs an honest exchange between real machines (the harnesses of
tests/protocol/*_net.py) and keeps the frames that crossed the wire as a corpus. A fresh
scenario is then stopped midway (bids, results, checks or chunks in flight) and fed hostile
frames: mutated corpus frames, valid frames replayed from the wrong sender or twice, and
well-typed messages of every class the scenario exchanges (the driver routes a machine
only its own service's types). A frame that decodes goes into ``handle(Received(...))``,
which must return a list of effects or raise ``RemoteProtocolError`` / ``InvalidMessage``;
then the scenario runs on to its end, which must raise nothing either (hostile input may not
leave a machine in a state that breaks later). Deterministic: ``derandomize=True``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import Message, decode, encode
from protocol.errors import InvalidMessage, RemoteProtocolError
from protocol.machine import PeerConnected, Received
from protocol.membership.machine import Membership, MembershipConfig
from protocol.membership.messages import Hello
from tests.protocol import ledger_net, relay_net
from tests.protocol.fuzzing import frame_of, messages_of, mutate
from tests.protocol.market_net import MarketNet
from tests.protocol.verify_net import VerifyNet

STRANGER = ledger_net.identity(77).peer_id
FUZZ = settings(max_examples=50, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class Scenario:
    """An exchange stopped midway: the machines to attack, and how to run it to its end."""

    targets: dict[str, object]
    finish: Callable[[], None]
    #: the frames that have crossed the wire so far
    sent: Callable[[], list[bytes]]


def _market() -> Scenario:
    net = MarketNet(3)
    net.submit()
    net.step_to(3)
    return Scenario({net.rq: net.auction, **{p: w.machine for p, w in net.workers.items()}},
                    lambda: net.step_to(net.now + 40_000),
                    lambda: [encode(m) for *_, m in net.sent])


def _verification() -> Scenario:
    net = VerifyNet(["ok", "ok"], ["honest", "honest", "honest"], seed=3)
    net.submit()
    net.step_to(150)
    targets = {net.rq: net.auction, **{p: w.machine for p, w in net.workers.items()},
               **{p: c.machine for p, c in net.checkers.items()}}
    return Scenario(targets, lambda: net.step_to(net.now + 40_000),
                    lambda: [encode(m) for *_, m in net.sent])


class _RecordingLedgerNet(ledger_net.Net):
    def feed(self, peer: str, event: object) -> None:
        if isinstance(event, Received):
            self.seen.append(encode(event.message))
        super().feed(peer, event)


def _ledger() -> Scenario:
    net = _RecordingLedgerNet()
    net.seen = []  # type: ignore[attr-defined]
    ms = [net.add(ledger_net.machine(i)) for i in range(3)]
    from protocol.ledger.events import SetCapability

    for m in ms:
        net.feed(m.peer_id, SetCapability(ledger_net.spec()))
    net.connect(ms[0].peer_id, ms[1].peer_id)
    net.connect(ms[1].peer_id, ms[2].peer_id)
    net.run()
    net.advance(net.now + 5_000)
    return Scenario({m.peer_id: m for m in ms},
                    lambda: (net.run(), net.advance(net.now + 120_000)),  # type: ignore[func-returns-value]
                    lambda: list(net.seen))  # type: ignore[attr-defined]


def _relay() -> Scenario:
    pub = relay_net.identity(1)
    ids = [relay_net.identity(i).peer_id for i in range(2, 6)]
    net = relay_net.Net.of([pub.peer_id, *ids])
    net.budget = 40
    net.publish(pub.peer_id, relay_net.manifest_for(pub, ids))

    def sent() -> list[bytes]:
        return [encode(e.message) for _, e in net.log
                if isinstance(getattr(e, "message", None), Message)]

    def finish() -> None:
        net.budget = None
        net.run()
        for t in (5_000, 30_000, 120_000):
            net.tick(t)

    return Scenario(dict(net.machines), finish, sent)


def _membership() -> Scenario:
    me = ledger_net.identity(60).peer_id
    cfg = MembershipConfig(network_id="testnet", agent_version="symphony/test")
    m = Membership(config=cfg, self_peer=me, rng=random.Random(7))
    sent: list[bytes] = []
    peers = [ledger_net.identity(61 + i).peer_id for i in range(3)]
    for i, peer in enumerate(peers):
        for e in m.handle(PeerConnected(peer, (f"/ip4/127.0.0.1/tcp/{4001 + i}/p2p/{peer}",)), 0):
            if isinstance(getattr(e, "message", None), Message):
                sent.append(encode(e.message))  # type: ignore[attr-defined]
        hello = Hello(network_id="testnet", protocol_version=cfg.protocol_version,
                      agent_version="x", listen_addrs=(f"/ip4/127.0.0.1/tcp/{4001 + i}",))
        sent.append(encode(hello))
        m.handle(Received(peer, hello), 1)
    for now in (6_000, 12_000):
        for e in m.handle(Received(peers[0], hello), now):
            if isinstance(getattr(e, "message", None), Message):
                sent.append(encode(e.message))  # type: ignore[attr-defined]

    def finish() -> None:
        for now in range(13_000, 200_000, 7_000):
            from protocol.machine import Tick

            m.handle(Tick(), now)

    return Scenario({me: m}, finish, lambda: sent)


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "market": _market, "verification": _verification, "ledger": _ledger,
    "relay": _relay, "membership": _membership,
}


@functools.cache
def corpus(name: str) -> tuple[bytes, ...]:
    """The frames of one whole honest run of scenario ``name`` (deduplicated, ordered)."""
    scenario = SCENARIOS[name]()
    scenario.finish()
    frames = list(dict.fromkeys(scenario.sent()))
    assert frames, f"the {name} scenario sent nothing to fuzz with"
    return tuple(frames)


def routed(name: str) -> frozenset[type[Message]]:
    """The message classes the scenario's machines exchange: the daemon's driver routes a
    machine only the types its service owns, so only these reach its ``handle``."""
    return frozenset(type(decode(f)) for f in corpus(name))


def _hostile_frame(data: st.DataObject, frames: tuple[bytes, ...],
                   classes: frozenset[type[Message]]) -> bytes:
    kind = data.draw(st.sampled_from(["mutated", "mutated", "replayed", "well-typed"]))
    if kind == "well-typed":
        cls = data.draw(st.sampled_from(sorted(classes, key=lambda c: c.TAG)))
        return frame_of(data.draw(messages_of(cls)))
    frame = data.draw(st.sampled_from(frames))
    return frame if kind == "replayed" else mutate(data, frame)


def _feed(machine: object, peer: str, frame: bytes, now: int,
          classes: frozenset[type[Message]]) -> None:
    try:
        msg = decode(frame)
    except InvalidMessage:
        return
    if type(msg) not in classes:  # the driver would route it to another service
        return
    try:
        effects = machine.handle(Received(peer, msg), now)  # type: ignore[attr-defined]
    except (RemoteProtocolError, InvalidMessage):
        return
    assert isinstance(effects, list)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@FUZZ
@given(data=st.data())
def test_hostile_frames_give_effects_or_remote_errors(name: str, data: st.DataObject) -> None:
    frames = corpus(name)
    scenario = SCENARIOS[name]()
    peers = sorted(scenario.targets)
    for _ in range(data.draw(st.integers(1, 4))):
        target = data.draw(st.sampled_from(peers))
        # any peer but the target itself: libp2p never delivers a node its own unicast
        sender = data.draw(st.sampled_from([*(p for p in peers if p != target), STRANGER]))
        now = data.draw(st.integers(0, 60_000))
        frame = _hostile_frame(data, frames, routed(name))
        _feed(scenario.targets[target], sender, frame, now, routed(name))
    scenario.finish()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_corpus_frame_replayed_to_every_machine(name: str) -> None:
    """The honest frames themselves, replayed to every machine from every sender, twice."""
    frames = corpus(name)
    scenario = SCENARIOS[name]()
    senders = [*sorted(scenario.targets), STRANGER]
    for frame in frames:
        for me, target in scenario.targets.items():
            for sender in senders:
                for now in (10, 10):
                    if sender != me:
                        _feed(target, sender, frame, now, routed(name))
    scenario.finish()
