"""protocol.inference.routing: chains over block servers, and auto block placement."""

from __future__ import annotations

import pytest

from protocol.codec import decode, encode, to_array
from protocol.inference.routing import (
    NoRoute,
    Server,
    blocks_text,
    choose_blocks,
    coverage,
    hop_cost,
    missing_blocks,
    parse_serve_blocks,
    plan_chain,
    span_for,
)
from protocol.ledger.records import BlockOffer, CapabilityRecord, HardwareSummary

M = "smollm2"


def srv(peer: str, start: int, end: int, ms: float = 1.0, free: int = 8, cache: int = 1 << 30,
        model: str = M) -> Server:
    return Server(peer=peer, model=model, start=start, end=end, ms_per_block=ms,
                  free_sessions=free, max_sessions=8, free_cache_bytes=cache)


def spans(chain: list) -> list[tuple[str, int, int]]:  # type: ignore[type-arg]
    return [(h.peer, h.start, h.end) for h in chain]


def test_two_servers_split_the_model() -> None:
    chain = plan_chain([srv("b", 15, 30), srv("a", 0, 15)], M, 0, 30)
    assert spans(chain) == [("a", 0, 15), ("b", 15, 30)]


def test_an_own_stage_at_no_round_trip_is_preferred_over_a_remote_copy() -> None:
    """The requester's own offer (round trip 0) beside another peer's of the same blocks."""
    servers = [srv("me", 0, 15), srv("a", 0, 15), srv("b", 15, 30)]
    rtts = {"me": 0.0, "a": 5.0, "b": 5.0}
    assert spans(plan_chain(servers, M, 0, 30, rtt_ms=rtts)) == [("me", 0, 15), ("b", 15, 30)]
    # without its round trip of 0 it would be the default's, and lose to "a"
    assert spans(plan_chain(servers, M, 0, 30, rtt_ms={"a": 5.0, "b": 5.0}))[0][0] == "a"
    # at no round trip, its range is still one hop, whatever float rounding of the pieces
    for ms in (4.012, 0.1, 3.988, 10.25):
        alone = [srv("me", 0, 15, ms=ms), srv("b", 15, 30, ms=ms)]
        assert spans(plan_chain(alone, M, 0, 30, rtt_ms={"me": 0.0})) == [("me", 0, 15),
                                                                           ("b", 15, 30)]


@pytest.mark.parametrize(("servers", "want", "text"), [
    ([srv("a", 0, 15)], [(15, 30)], "blocks 15-30"),
    ([srv("a", 0, 15), srv("b", 15, 30)], [], "no blocks"),
    ([srv("a", 5, 10), srv("b", 20, 29)], [(0, 5), (10, 20), (29, 30)],
     "blocks 0-5, 10-20 and 29-30"),
    ([srv("a", 0, 30, model="other")], [(0, 30)], "blocks 0-30"),
    ([], [(0, 30)], "blocks 0-30"),
])
def test_missing_blocks_are_the_ranges_no_offer_covers(servers: list[Server],
                                                       want: list[tuple[int, int]],
                                                       text: str) -> None:
    assert missing_blocks(servers, M, 30) == want
    assert blocks_text(want) == text


def test_fewer_hops_win_when_round_trips_cost() -> None:
    servers = [srv("a", 0, 10), srv("b", 10, 20), srv("c", 20, 30), srv("whole", 0, 30, ms=1.5)]
    # three hops: 3 rtt + 30 ms; one hop: 1 rtt + 45 ms
    assert spans(plan_chain(servers, M, 0, 30, rtt_ms={p: 20.0 for p in "abc"} | {"whole": 20.0})) \
        == [("whole", 0, 30)]
    assert [h.peer for h in plan_chain(servers, M, 0, 30, rtt_ms={p: 1.0 for p in "abc"}
                                       | {"whole": 1.0})] == ["a", "b", "c"]


def test_overlapping_servers_are_cut_where_cheapest() -> None:
    slow_tail = [srv("fast", 0, 20, ms=1.0), srv("slow", 10, 30, ms=5.0)]
    assert spans(plan_chain(slow_tail, M, 0, 30, rtt_ms={"fast": 1, "slow": 1})) == [
        ("fast", 0, 20), ("slow", 20, 30)]


def test_excluded_full_and_cacheless_servers_are_skipped() -> None:
    servers = [srv("a", 0, 30), srv("b", 0, 30, ms=3.0), srv("c", 0, 30, free=0),
               srv("d", 0, 30, cache=10)]
    assert spans(plan_chain(servers, M, 0, 30, excluded={"a"}, cache_bytes_per_block=100)) == [
        ("b", 0, 30)]
    with pytest.raises(NoRoute, match="block 0"):
        plan_chain(servers, M, 0, 30, excluded={"a", "b"}, cache_bytes_per_block=100)


def test_a_gap_names_the_first_uncovered_block() -> None:
    with pytest.raises(NoRoute) as info:
        plan_chain([srv("a", 0, 12), srv("b", 14, 30)], M, 0, 30)
    assert info.value.block == 12
    with pytest.raises(NoRoute):
        plan_chain([srv("a", 0, 30, model="other")], M, 0, 30)


def test_a_sub_span_is_planned_for_recovery() -> None:
    servers = [srv("a", 0, 10), srv("b", 10, 20), srv("b2", 10, 20, ms=2.0), srv("c", 20, 30)]
    assert spans(plan_chain(servers, M, 10, 20, excluded={"b"})) == [("b2", 10, 20)]


def test_load_makes_a_server_costlier() -> None:
    idle, busy = srv("idle", 0, 30), srv("busy", 0, 30, free=1)
    assert hop_cost(busy, 30, 5.0) > hop_cost(idle, 30, 5.0)
    assert spans(plan_chain([busy, idle], M, 0, 30)) == [("idle", 0, 30)]


def test_ties_are_broken_by_peer_id() -> None:
    assert plan_chain([srv("z", 0, 30), srv("m", 0, 30)], M, 0, 30)[0].peer == "m"


def test_choose_blocks_fills_the_weakest_range() -> None:
    servers = [srv("a", 0, 10), srv("b", 0, 10), srv("c", 10, 20)]
    assert coverage(servers, M, 30)[25] == 0.0
    assert choose_blocks(servers, M, 30, 10, own_peer="me") == (20, 30)
    assert choose_blocks(servers + [srv("d", 20, 30), srv("e", 20, 30)], M, 30, 10,
                         own_peer="me") == (10, 20)


def test_choose_blocks_keeps_its_range_within_the_hysteresis() -> None:
    servers = [srv("a", 0, 10), srv("b", 10, 20, ms=1.1), srv("c", 20, 30)]
    # [10, 20) is only slightly weaker than ours: stay
    assert choose_blocks(servers, M, 30, 10, own_peer="me", current=(0, 10)) == (0, 10)
    # a hole elsewhere: move to it
    assert choose_blocks(servers[:2], M, 30, 10, own_peer="me", current=(0, 10)) == (20, 30)
    # our own offer does not count as coverage
    assert choose_blocks(servers + [srv("me", 0, 10)], M, 30, 10, own_peer="me",
                         current=(0, 10)) == (0, 10)


def test_span_for_memory() -> None:
    assert span_for(30, 100, 1000) == 5
    assert span_for(30, 100, 10) == 1
    assert span_for(30, 100, 10**9) == 30
    with pytest.raises(ValueError):
        choose_blocks([], M, 30, 31, own_peer="me")


def _record(**extra: object) -> CapabilityRecord:
    return CapabilityRecord(
        network_id="n", peer_id="p", seq=1, issued_at_ms=1, expires_at_ms=2, listen_addrs=(),
        models=(), hardware=HardwareSummary(device_kind="cpu", device_name="x", memory_bytes=1,
                                            cpu_cores=2),
        price_per_1k_tokens=0.0, free_slots=1, max_slots=1, load=0.0, roles=(), tags=(),
        software_version="t", **extra)  # type: ignore[arg-type]


def test_capability_record_carries_block_offers_and_old_records_decode() -> None:
    offer = BlockOffer(model=M, start=0, end=15, n_blocks=30, ms_per_block=0.7,
                       free_sessions=4, max_sessions=8, free_cache_bytes=1 << 20)
    rec = _record(blocks=(offer,))
    assert decode(encode(rec), CapabilityRecord).blocks == (offer,)
    import msgpack

    old = msgpack.packb(to_array(_record())[:-1], use_bin_type=True)  # a record from before
    assert decode(old, CapabilityRecord).blocks == ()
    with pytest.raises(Exception, match="block range"):
        decode(encode(BlockOffer(model=M, start=5, end=40, n_blocks=30, ms_per_block=1.0,
                                 free_sessions=1, max_sessions=1, free_cache_bytes=0)))


@pytest.mark.parametrize(("text", "want"), [
    ("", None), ("  ", None), ("auto", "auto"), ("0:15", (0, 15)), (" 15:30 ", (15, 30))])
def test_parse_serve_blocks(text: str, want: object) -> None:
    assert parse_serve_blocks(text) == want


@pytest.mark.parametrize("text", ["15:15", "20:10", "a:b", "5", "-1:4", "auto:3", "1:2:3"])
def test_parse_serve_blocks_names_a_bad_value(text: str) -> None:
    with pytest.raises(ValueError, match="'auto' or 'A:B'"):
        parse_serve_blocks(text)
