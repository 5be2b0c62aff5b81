"""node/p2p/link.py: the link spec and the pure schedule, driven by an injected clock."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from node.config import ConfigError, load_config
from node.p2p.link import (
    BUCKET_BYTES,
    DUP_ACKS,
    MIN_RTO_S,
    MSS_BYTES,
    LinkSchedule,
    LinkSpec,
    LinkSpecError,
    TokenBucket,
    parse_link,
)


def test_a_spec_string_parses_into_its_parts() -> None:
    spec = parse_link("rtt=60ms,up=20mbit,loss=0.5%")
    assert spec == LinkSpec(rtt_s=0.06, up_bps=20e6, loss=0.005)
    full = parse_link(" rtt = 1s , jitter=5ms,up=512kbit,down=1gbit,loss=2% ")
    assert full == LinkSpec(rtt_s=1.0, jitter_s=0.005, up_bps=512e3, down_bps=1e9, loss=0.02)
    assert parse_link("up=100bit") == LinkSpec(up_bps=100.0)
    assert parse_link("") is None and parse_link("  ") is None
    assert parse_link(str(full)) == full  # str() writes a spec that parses back


@pytest.mark.parametrize(("spec", "names"), [
    ("rtt=60", ["'rtt=60'", "ms or s"]),
    ("rtt=60ms,up=20", ["'up=20'", "a rate needs a unit"]),
    ("up=20mbps", ["'up=20mbps'", "a rate needs a unit"]),
    ("loss=0.5", ["'loss=0.5'", "percentage"]),
    ("loss=100%", ["'loss=100%'", "below 100%"]),
    ("rtt=-5ms", ["'rtt=-5ms'", "not a number"]),
    ("up=0mbit", ["'up=0mbit'", "above zero"]),
    ("rtt=61s", ["'rtt=61s'", "more than 60 s"]),
    ("latency=5ms", ["unknown key 'latency'", "known: rtt"]),
    ("rtt=5ms,rtt=6ms", ["'rtt' is given twice"]),
    ("rtt=5ms,,up=1mbit", ["part '' is not key=value"]),
    ("rtt", ["part 'rtt' is not key=value"]),
])
def test_a_bad_spec_is_an_error_that_names_the_bad_part(spec: str, names: list[str]) -> None:
    with pytest.raises(LinkSpecError) as raised:
        parse_link(spec)
    for name in names:
        assert name in str(raised.value)


def test_the_token_bucket_paces_chunks_at_its_rate_after_a_full_bucket_burst() -> None:
    bucket = TokenBucket(1000.0, depth_bytes=500)  # 1000 B/s, 500 B burst
    assert bucket.take(500, now_s=10.0) == 10.0  # the burst leaves at once
    assert bucket.take(1000, now_s=10.0) == 11.0  # then a second per 1000 B
    assert bucket.take(500, now_s=10.5) == 11.5  # behind the debt, whenever written
    # idle time refills it, but never past its depth
    assert bucket.take(500, now_s=100.0) == 100.0
    assert bucket.take(100, now_s=100.0) == 100.1


def test_a_cap_paces_what_is_written_and_delay_comes_on_top() -> None:
    spec = LinkSpec(rtt_s=0.06, up_bps=8e6)  # 1 MB/s, 30 ms one way
    schedule = LinkSchedule(spec, random.Random(1))
    now, last = 0.0, None
    for _ in range(100):  # a writer that writes each chunk when the last has left
        last = schedule.send(100_000, now)
        now = last.depart_at_s
    assert last is not None
    # 10 MB at 1 MB/s, less the bucket's free burst; arrival 30 ms after departure
    assert last.depart_at_s == pytest.approx(10.0 - BUCKET_BYTES / 1e6)
    assert last.deliver_at_s == pytest.approx(last.depart_at_s + 0.03)
    assert last.lost_segments == 0


def test_jitter_varies_the_delay_but_never_reorders() -> None:
    spec = LinkSpec(rtt_s=0.02, jitter_s=0.008)
    sparse = LinkSchedule(spec, random.Random(7))  # chunks further apart than 2 jitters
    delays = [sparse.send(100, i * 0.02).deliver_at_s - i * 0.02 for i in range(2000)]
    assert min(delays) >= 0.002 - 1e-9 and max(delays) <= 0.018 + 1e-9
    assert min(delays) < 0.0025 and max(delays) > 0.0175  # the whole ±8 ms range is used
    assert sum(delays) / len(delays) == pytest.approx(0.010, abs=0.0003)  # centred on rtt/2
    dense = LinkSchedule(spec, random.Random(7))  # 1 ms apart: a later draw may be shorter
    legs = [dense.send(100, i * 0.001) for i in range(2000)]
    assert all(a.deliver_at_s <= b.deliver_at_s for a, b in zip(legs, legs[1:], strict=False))


def test_a_lost_segment_costs_a_round_trip_or_the_retransmission_timeout() -> None:
    spec = LinkSpec(rtt_s=0.06, loss=0.01)
    schedule = LinkSchedule(spec, random.Random(3))
    chunk = 40 * MSS_BYTES
    costs: dict[float, int] = {}
    lost_total, n = 0, 5000
    for i in range(n):
        now = i * 10.0  # far apart: no chunk waits behind another
        leg = schedule.send(chunk, now)
        extra = round(leg.deliver_at_s - now - 0.03, 6)
        costs[extra] = costs.get(extra, 0) + 1
        lost_total += leg.lost_segments
        assert (extra == 0) == (leg.lost_segments == 0)
    assert set(costs) == {0.0, 0.06, MIN_RTO_S}  # fast retransmit +rtt, tail loss +RTO
    # 1% of the segments are lost (binomial: 2000 expected, sd about 45)
    assert 1800 < lost_total < 2200
    # a tail loss (last DUP_ACKS segments) is about DUP_ACKS/40 of the chunks with a loss
    tail_share = costs[MIN_RTO_S] / (costs[MIN_RTO_S] + costs[0.06])
    assert DUP_ACKS / 40 * 0.6 < tail_share < DUP_ACKS / 40 * 1.6


def test_a_late_chunk_holds_back_the_ones_after_it() -> None:
    schedule = LinkSchedule(LinkSpec(rtt_s=0.1, loss=0.3), random.Random(5))
    legs = [schedule.send(MSS_BYTES, i * 0.001) for i in range(200)]
    first_loss = next(i for i, leg in enumerate(legs) if leg.lost_segments)
    late = legs[first_loss].deliver_at_s
    assert late == pytest.approx(first_loss * 0.001 + 0.05 + MIN_RTO_S)  # one segment: a tail
    follower = legs[first_loss + 1]
    assert follower.deliver_at_s == late  # sent 1 ms later, not lost, yet arrives with it


def test_the_schedule_is_the_same_for_the_same_seed() -> None:
    spec = LinkSpec(rtt_s=0.05, jitter_s=0.01, up_bps=1e6, loss=0.05)
    runs = [[LinkSchedule(spec, random.Random(11)).send(3000, 0.0)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_the_node_config_takes_a_link_and_names_a_bad_one(tmp_path: Path) -> None:
    flags = {"data_dir": str(tmp_path)}
    assert load_config(flags, env={}).link == ""
    config = load_config(flags, env={"SYMPHONY_LINK": "rtt=60ms,up=20mbit"})
    assert parse_link(config.link) == LinkSpec(rtt_s=0.06, up_bps=20e6)
    with pytest.raises(ConfigError, match=r"key 'link': .*part 'up=20'.*a rate needs a unit"):
        load_config({**flags, "link": "rtt=60ms,up=20"}, env={})
