"""The swarm with a tiny machine: gossip, unicast, faults, partitions, churn, determinism."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from protocol.errors import LocalProtocolError
from protocol.machine import Emit, Send
from protocol.membership.messages import Ping
from simulations.network import MBIT, LatencyModel, LinkFaults
from simulations.node import MachineSpec
from simulations.swarm import Swarm
from tests.simulations.tiny import SPEC, Call, Shout, TinyMachine


def make_swarm(seed: int, n: int = 40, **kwargs: object) -> Swarm:
    swarm = Swarm(seed, latency=LatencyModel("lognormal", 20.0, 0.5, jitter_ms=4.0), **kwargs)  # type: ignore[arg-type]
    nodes = [swarm.add_node((SPEC,)) for _ in range(n)]
    for node in nodes:
        swarm.start(node)
    rng = random.Random(seed)
    for node in nodes:
        swarm.connect_random(node, 4, rng)
    return swarm


def tiny(swarm: Swarm, i: int) -> TinyMachine:
    machine = swarm.nodes[i].machine("tiny")
    assert isinstance(machine, TinyMachine)
    return machine


@pytest.mark.parametrize("wire_bytes", [False, True])
def test_gossip_reaches_every_connected_node_once(wire_bytes: bool) -> None:
    swarm = make_swarm(1, wire_bytes=wire_bytes)
    heard: list[tuple[int, str]] = []
    swarm.on_emit("heard", lambda node, f, now: heard.append((node.index, str(f["origin"]))))
    swarm.nodes[0].submit("tiny", Shout(7))
    swarm.run(10_000)
    assert sorted(i for i, _ in heard) == list(range(1, 40))
    assert {o for _, o in heard} == {swarm.nodes[0].peer_id}
    assert "emit.dup" not in swarm.metrics.counters
    assert swarm.metrics.counters["gossip_duplicates"] > 0  # meshes overlap: copies are dropped
    assert swarm.nodes[0].bytes_sent > 0 and sum(n.bytes_received for n in swarm.nodes) > 0


def test_unicast_round_trip_and_latency_is_positive() -> None:
    swarm = make_swarm(2, n=5)
    a, b = swarm.nodes[0], swarm.nodes[3]
    a.submit("tiny", Call(b.peer_id, 99))
    swarm.run(5)
    assert tiny(swarm, 0).pongs == []
    swarm.run(5_000)
    assert tiny(swarm, 0).pongs == [99]


def test_lost_unicast_comes_back_as_send_failed() -> None:
    swarm = make_swarm(3, n=4, faults=LinkFaults(loss=1.0))
    swarm.nodes[0].submit("tiny", Call(swarm.nodes[1].peer_id, 1))
    swarm.run(30_000)
    assert tiny(swarm, 0).failed == ["lost"] and tiny(swarm, 0).pongs == []


def test_duplicated_gossip_is_dropped_by_the_seen_cache() -> None:
    swarm = make_swarm(4, n=10, faults=LinkFaults(duplicate=1.0))
    swarm.nodes[0].submit("tiny", Shout(5))
    swarm.run(10_000)
    assert swarm.metrics.counters["emit.heard"] == 9
    assert "emit.dup" not in swarm.metrics.counters


def test_partition_blocks_then_heals() -> None:
    swarm = make_swarm(5, n=10)
    swarm.partition([list(range(5)), list(range(5, 10))], start_ms=0, heal_ms=20_000)
    swarm.run(1)
    swarm.nodes[0].submit("tiny", Call(swarm.nodes[7].peer_id, 1))
    swarm.run(15_000)
    assert tiny(swarm, 0).failed == ["timeout"]
    swarm.run(21_000)
    swarm.nodes[0].submit("tiny", Call(swarm.nodes[7].peer_id, 2))
    swarm.run(25_000)
    assert tiny(swarm, 0).pongs == [2]


def test_crash_loses_machine_state_but_restart_keeps_the_store() -> None:
    swarm = make_swarm(6, n=6)
    swarm.nodes[0].submit("tiny", Shout(11))
    swarm.run(5_000)
    victim = swarm.nodes[3]
    assert 11 in tiny(swarm, 3).seen
    swarm.crash(victim)
    assert not victim.up and victim.connections == {}
    assert all(3 not in n.connections for n in swarm.nodes)
    swarm.start(victim)
    assert tiny(swarm, 3).seen == {11}  # rebuilt from the store
    assert victim.connections == {}  # connections are the caller's to redo


def test_unicast_to_a_crashed_node_fails() -> None:
    swarm = make_swarm(7, n=5)
    swarm.crash(swarm.nodes[2])
    swarm.nodes[0].submit("tiny", Call(swarm.nodes[2].peer_id, 3))
    swarm.run(20_000)
    assert tiny(swarm, 0).failed == ["timeout"]


def test_bandwidth_limits_big_transfers() -> None:
    swarm = Swarm(8, latency=LatencyModel("constant", 10.0))
    a = swarm.add_node((SPEC,), up_bps=1 * MBIT)
    b = swarm.add_node((SPEC,), down_bps=100 * MBIT)
    swarm.start(a)
    swarm.start(b)
    # 125 kB at 1 Mbit/s is one second, plus 10 ms of latency
    arrivals = swarm.net.transfer(a.index, b.index, 125_000, 0)
    assert arrivals == (1_010_001,)
    second = swarm.net.transfer(a.index, b.index, 125_000, 0)
    assert second[0] == pytest.approx(2_010_002, abs=2)


def test_an_unknown_effect_is_a_local_error() -> None:
    odd = MachineSpec(name="odd", build=lambda node: _Odd())
    swarm = Swarm(9)
    node = swarm.add_node((odd,))
    swarm.start(node)
    with pytest.raises(LocalProtocolError, match="no performer"):
        node.submit("odd", object())


class _Odd:
    def handle(self, event: object, now: int) -> list[object]:
        return [Emit("x"), "not an effect"]

    def next_deadline(self) -> int | None:
        return None


def test_timers_fire_at_the_machine_deadline() -> None:
    swarm = make_swarm(10, n=2)
    machine = tiny(swarm, 0)
    machine.wake_at = swarm.epoch_ms + 1234
    swarm.nodes[0].arm(swarm.nodes[0].slots["tiny"])
    swarm.run(1233)
    assert machine.ticks == 0
    swarm.run(1234)
    assert machine.ticks == 1
    swarm.run(100_000)
    assert machine.ticks == 1


def test_penalties_disconnect_and_ban() -> None:
    swarm = make_swarm(11, n=3)
    a, b = swarm.nodes[0], swarm.nodes[1]
    swarm.connect(a, b)
    a.penalize(b.peer_id, "spam", 100)
    assert b.index not in a.connections and a.is_banned(b.peer_id)
    b.submit("tiny", Call(a.peer_id, 4))  # dropped on arrival: a has banned b
    swarm.run(30_000)
    assert tiny(swarm, 1).pongs == []


def fingerprint(seed: int) -> str:
    swarm = make_swarm(seed, n=30, faults=LinkFaults(loss=0.05, duplicate=0.05))
    for i in range(5):
        swarm.nodes[i].submit("tiny", Shout(i))
        swarm.nodes[i].submit("tiny", Call(swarm.nodes[i + 10].peer_id, i))
    swarm.run(30_000)
    state = {
        "metrics": swarm.metrics.to_dict(),
        "bytes": swarm.bytes_per_node(),
        "peers": [n.peer_id for n in swarm.nodes],
        "now": swarm.loop.events_run,
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_seed_same_run_other_seed_other_run(seed: int) -> None:
    assert fingerprint(seed) == fingerprint(seed), f"seed {seed} is not reproducible"
    assert fingerprint(seed) != fingerprint(seed + 100), f"seed {seed} ignored"


def test_send_effect_from_machine_uses_the_wire_when_asked() -> None:
    swarm = make_swarm(12, n=3, wire_bytes=True)
    swarm.perform(
        swarm.nodes[0], swarm.nodes[0].slots["tiny"], Send(swarm.nodes[1].peer_id, Ping(nonce=5))
    )
    swarm.run(5_000)
    assert tiny(swarm, 0).pongs == [5]


def test_a_garbage_frame_penalizes_its_sender() -> None:
    swarm = make_swarm(13, n=3, wire_bytes=True)
    a, b = swarm.nodes[0], swarm.nodes[1]
    swarm.transport._arrive(b, b.epoch, a, b"\xc1garbage", 8)
    assert swarm.metrics.counters["invalid_frames"] == 1
    assert b.scores[a.peer_id][0] > 0


def test_membership_machines_build_a_connected_network() -> None:
    from protocol.membership.machine import MembershipConfig
    from simulations.machines.membership import bootstrap, membership_spec

    swarm = Swarm(14, latency=LatencyModel("uniform", 5.0, 40.0), wire_bytes=True)
    spec = membership_spec(
        MembershipConfig(network_id="sim", agent_version="sim/0", target_peers=4)
    )
    nodes = [swarm.add_node((spec,)) for _ in range(20)]
    for node in nodes:
        swarm.start(node)
    for node in nodes[1:]:
        bootstrap(node, [nodes[0]])
    swarm.run(60_000)
    assert all(len(n.connections) >= 2 for n in nodes)
    assert swarm.metrics.counters["emit.peer_ready"] >= 2 * 20
