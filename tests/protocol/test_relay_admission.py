"""Which relay manifests a node plans and keeps (protocol/relay/admission.py)."""

from __future__ import annotations

import pytest

from protocol.errors import LocalProtocolError
from protocol.machine import Effect, Emit, Penalize, Received
from protocol.relay import machine as relay_machine
from protocol.relay.admission import FLOOD_PENALTY
from protocol.relay.events import FetchVersion, PrepareVersion
from protocol.relay.machine import RelayMachine
from protocol.relay.manifest import Manifest
from tests.protocol.relay_net import identity, manifest_for

ME = identity(2).peer_id
OTHER = identity(3).peer_id
SIGNERS = [identity(n) for n in (10, 11, 12)]


def offer(machine: RelayMachine, manifest: Manifest, sender: str | None = None) -> list[Effect]:
    return machine.handle(Received(sender or manifest.signer, manifest.message), 0)


def events(effects: list[Effect]) -> list[str]:
    return [e.event for e in effects if isinstance(e, Emit)]


def penalties(effects: list[Effect]) -> list[Penalize]:
    return [e for e in effects if isinstance(e, Penalize)]


def test_a_stranger_manifest_is_remembered_not_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real = relay_machine.build_striped_plan

    def counting(*args: object, **kwargs: object) -> object:
        built.append(args[0].root)  # type: ignore[attr-defined]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(relay_machine, "build_striped_plan", counting)
    me = RelayMachine(ME)
    stranger = manifest_for(SIGNERS[0], [OTHER], name="theirs")
    effects = offer(me, stranger)
    assert built == [] and not any(isinstance(e, PrepareVersion) for e in effects)
    assert stranger.id in me.book.known and stranger.id not in me.transfers
    assert me.latest_version(stranger.key) == 1  # still stale-checked: a replay is nothing
    assert offer(me, stranger) == []
    mine = manifest_for(SIGNERS[0], [ME, OTHER], name="ours")
    assert any(isinstance(e, PrepareVersion) for e in offer(me, mine))
    assert built == [SIGNERS[0].peer_id] and mine.id in me.transfers
    # asking for the remembered artifact plans and fetches it
    effects = me.handle(FetchVersion("theirs"), 0)
    assert PrepareVersion(stranger) in effects and stranger.id in me.transfers
    assert stranger.id not in me.book.known and len(built) == 2


def test_a_signer_over_its_cap_evicts_its_oldest_known_and_is_penalized() -> None:
    me = RelayMachine(ME, max_manifests_per_signer=3)
    flood = [manifest_for(SIGNERS[0], [OTHER], name=f"a{i}") for i in range(5)]
    for m in flood[:3]:
        assert penalties(offer(me, m)) == []
    effects = offer(me, flood[3])
    assert [p.points for p in penalties(effects)] == [FLOOD_PENALTY]
    assert penalties(effects)[0].peer == SIGNERS[0].peer_id
    assert "manifest_evicted" in events(effects)
    assert list(me.book.known) == [m.id for m in flood[1:4]]
    assert me.latest_version(flood[0].key) == 0  # its artifact is forgotten with it
    # another signer is not held to the first one's cap
    assert penalties(offer(me, manifest_for(SIGNERS[1], [OTHER], name="b"))) == []


def test_a_signer_at_its_cap_with_nothing_to_evict_is_refused() -> None:
    me = RelayMachine(ME, max_manifests_per_signer=2)
    ours = [manifest_for(SIGNERS[0], [ME], name=f"a{i}") for i in range(3)]
    for m in ours[:2]:
        offer(me, m)
    effects = offer(me, ours[2], sender=OTHER)
    assert "manifest_refused" in events(effects) and ours[2].id not in me.transfers
    assert [(p.peer, p.points) for p in penalties(effects)] == [(OTHER, FLOOD_PENALTY)]
    assert not any(isinstance(e, PrepareVersion) for e in effects)
    # a newer version of an artifact already kept is always admitted
    v2 = manifest_for(SIGNERS[0], [ME], name="a0", version=2)
    effects = offer(me, v2)
    assert PrepareVersion(v2) in effects and penalties(effects) == []
    assert ours[0].id not in me.transfers  # superseded


def test_the_total_cap_evicts_the_heaviest_signers_oldest_known() -> None:
    me = RelayMachine(ME, max_manifests_per_signer=10, max_manifests=4)
    heavy = [manifest_for(SIGNERS[0], [OTHER], name=f"h{i}") for i in range(3)]
    light = manifest_for(SIGNERS[1], [OTHER], name="l")
    for m in [heavy[0], light, heavy[1], heavy[2]]:
        offer(me, m)
    newcomer = manifest_for(SIGNERS[2], [OTHER], name="n")
    effects = offer(me, newcomer)
    assert penalties(effects) == []  # the newcomer did not flood
    assert set(me.book.known) == {light.id, heavy[1].id, heavy[2].id, newcomer.id}


def test_the_total_cap_refuses_when_every_kept_manifest_is_planned() -> None:
    me = RelayMachine(ME, max_manifests=2)
    for n in range(2):
        offer(me, manifest_for(SIGNERS[n], [ME], name="x"))
    late = manifest_for(SIGNERS[2], [ME], name="x")
    effects = offer(me, late)
    assert "manifest_refused" in events(effects) and late.id not in me.transfers
    assert [p.points for p in penalties(effects)] == [FLOOD_PENALTY]
    assert me.latest_version(late.key) == 0  # refused: a later offer is judged afresh


def test_caps_must_be_positive() -> None:
    with pytest.raises(LocalProtocolError):
        RelayMachine(ME, max_manifests=0)
    with pytest.raises(LocalProtocolError):
        RelayMachine(ME, max_manifests_per_signer=0)
