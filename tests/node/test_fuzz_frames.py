"""What the fuzz bench attacks: its names for the protocols the daemon announces, and the
frames it writes for each (node/bench/fuzz/frames.py)."""

from __future__ import annotations

import random

import pytest

from crypto.keys import Identity
from node.bench.fuzz.frames import KINDS, MAKERS, framing_of, short_name, target_for

NET = "bench-fuzz"


@pytest.mark.parametrize(("protocol_id", "name", "framing"), [
    (f"/symphony/{NET}/msg/1", "msg", "framed"),
    (f"/symphony/{NET}/relay-chunks/1", "relay-chunks", "framed"),
    ("/symphony/handshake/1", "handshake", "framed"),
    ("/meshsub/1.2.0", "meshsub-1.2", "varint"),
    ("/ipfs/ping/1.0.0", "ping", "raw"),
    ("/ipfs/id/push/1.0.0", "identify-push", "varint"),
    ("/example/kad/1.0.0", "example-kad-1_0_0", "varint"),  # one nobody named
])
def test_any_announced_protocol_gets_a_name_and_a_framing(protocol_id: str, name: str,
                                                           framing: str) -> None:
    assert short_name(protocol_id, NET) == name
    assert framing_of(protocol_id) == framing


@pytest.mark.parametrize("protocol_id", [
    f"/symphony/{NET}/msg/1", f"/symphony/{NET}/verify-states/1", "/symphony/handshake/1",
    "/meshsub/1.1.0", "/ipfs/ping/1.0.0", "/ipfs/id/1.0.0", "/libp2p/dcutr"])
def test_every_kind_makes_frames_for_every_protocol(protocol_id: str) -> None:
    attacker = Identity.from_seed(bytes(32))
    target = target_for(protocol_id, NET, attacker, attacker.peer_id, 1_700_000_000_000)
    rng = random.Random(1)
    for kind in KINDS:
        frames = [MAKERS[kind](target, rng) for _ in range(20)]
        assert all(frames), kind
    replayed = {MAKERS["replay"](target, rng) for _ in range(3)}
    assert len(replayed) == 1  # the same bytes every time
    if target.framing == "framed":  # a 4-byte length that tells the truth, but for bad_length
        body = MAKERS["random"](target, rng)
        assert int.from_bytes(body[:4], "big") == len(body) - 4


def test_a_kind_banned_at_once_leaves_its_share_to_the_kinds_after_it() -> None:
    from node.bench.fuzz.attacker import kind_share

    total, sent, shares = 100_000, 0, []
    for i, frames_sent in enumerate([900, 40, None, None, None]):  # bad_length, oversized, ...
        share = kind_share(total, sent, 5 - i)
        shares.append(share)
        sent += share if frames_sent is None else frames_sent
    assert shares == [20_000, 24_775, 33_020, 33_020, 33_020]
    assert sent == total  # what the first two left unsent went to the three after them
