"""The network limits, the unicast intake (floods, replays) and logs a peer cannot flood."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import pytest

from node.config import ConfigError, load_config
from node.daemon import config_sections
from node.logs import RepeatFilter, RepeatLog
from node.penalties import FAULT_PENALTIES, PENALTY_BAN_THRESHOLD, PenaltyBook
from node.runtime.intake import MAX_DIGESTS_PER_PEER, PeerIntake
from node.runtime.limits import NetLimits


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event, fields))

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append(("error", event, fields))


def test_a_repeated_fault_is_logged_once_then_summarized_per_interval() -> None:
    out = Lines()
    log = RepeatLog(out, interval_ms=1000)
    for t in range(0, 2500, 10):  # 250 faults in 2.5 s from one peer
        log.note(("p", "undecodable"), t, "driver.penalized", peer="p")
    log.note(("q", "undecodable"), 2500, "driver.penalized", peer="q")
    assert [(e, f["peer"], f.get("repeats")) for _, e, f in out.lines] == [
        ("driver.penalized", "p", None),
        ("driver.penalized.repeated", "p", 100),
        ("driver.penalized.repeated", "p", 100),
        ("driver.penalized", "q", None)]
    assert log.suppressed == 250 - 3


def test_first_lines_of_made_up_keys_are_capped_per_interval_and_counted() -> None:
    """An attacker that makes up a key per fault (a fresh peer id each) gets at most
    ``max_first`` lines per interval, whatever the number of keys; the next line says how
    many were left out, and a key left out is new again later."""
    out = Lines()
    log = RepeatLog(out, interval_ms=1000, max_first=3)
    for i in range(50):
        log.note((f"sybil{i}", "undecodable"), i, "driver.penalized", peer=f"sybil{i}")
    assert [f["peer"] for _, _, f in out.lines] == ["sybil0", "sybil1", "sybil2"]
    assert log.suppressed == 47
    log.note(("sybil7", "undecodable"), 1000, "driver.penalized", peer="sybil7")
    assert out.lines[-1][1:] == ("driver.penalized", {"peer": "sybil7",
                                                      "new_keys_suppressed": 47})
    for i in range(50, 60):  # the next interval: its cap again, no more
        log.note((f"sybil{i}", "undecodable"), 1500, "driver.penalized", peer=f"sybil{i}")
    assert len(out.lines) == 4 + 2


def test_the_repeat_log_forgets_the_oldest_key_and_keeps_tracebacks_out_of_summaries() -> None:
    out = Lines()
    log = RepeatLog(out, interval_ms=10, max_keys=2)
    boom = RuntimeError("ours")
    log.note("a", 0, "x", exc_info=boom)
    log.note("b", 0, "x")
    log.note("c", 0, "x")  # forgets "a"
    log.note("a", 1, "x", exc_info=boom)  # so "a" is new again
    log.note("a", 20, "x", exc_info=boom)
    assert [(level, "exc_info" in f) for level, _, f in out.lines] == [
        ("error", True), ("warning", False), ("warning", False), ("error", True),
        ("warning", False)]


def test_third_party_lines_a_peer_provokes_are_summarized_without_tracebacks() -> None:
    keep = RepeatFilter(interval_s=3600)

    def record(name: str, msg: str, line: int) -> logging.LogRecord:
        try:
            raise ValueError("peer bytes")
        except ValueError:
            return logging.LogRecord(name, logging.ERROR, "upstream.py", line, msg, None,
                                     sys.exc_info())

    first = record("libp2p.pubsub", "bad record from peer A", 10)
    assert keep.filter(first) and first.exc_info is None
    # the same line of code with other text (an f-string naming another peer): a repeat
    assert not keep.filter(record("libp2p.pubsub", "bad record from peer B", 10))
    assert keep.filter(record("libp2p.pubsub", "another line", 20))
    assert keep.filter(record("hypercorn.access", "GET /status", 30))
    assert keep.filter(record("hypercorn.access", "GET /status", 30))  # not peer-fed
    summarize = RepeatFilter(interval_s=0)  # every repeat is past the interval
    assert summarize.filter(record("libp2p.pubsub", "bad record from peer A", 10))
    again = record("libp2p.pubsub", "bad record from peer B", 10)
    assert summarize.filter(again) and again.exc_info is None
    assert re.fullmatch(r"bad record from peer B \[repeated 1 times in \d+ s\]", again.msg)
    # lines from ever new call sites: the global cap on first lines applies to them too
    capped = RepeatFilter(interval_s=3600, max_first=2)
    passed = [capped.filter(record("libp2p.x", "bad", line)) for line in range(100, 110)]
    assert passed == [True, True] + [False] * 8


def test_a_flood_is_refused_beyond_the_rate_and_the_bucket_refills() -> None:
    intake = PeerIntake(NetLimits(max_messages_per_peer_per_s=10))
    verdicts = [intake.check("p", i.to_bytes(4, "big"), 0) for i in range(15)]
    assert verdicts == [None] * 10 + ["flood"] * 5
    assert intake.check("q", b"other peer", 0) is None
    assert intake.check("p", b"later", 500) is None  # half a second refills 5


def test_replays_beyond_the_allowance_are_refused_within_the_window_only() -> None:
    intake = PeerIntake(NetLimits(replay_window_s=10, replay_allowance=3))
    frame = b"the same signed message" * 5
    assert [intake.check("s", b"short request", t) for t in range(6)] == [None] * 6
    assert [intake.check("p", frame, t) for t in range(6)] == [
        None, None, None, "replay", "replay", "replay"]
    assert intake.check("q", frame, 6) is None  # another peer's copy is its own
    assert intake.check("p", frame, 10_007) is None  # a new window
    for i in range(MAX_DIGESTS_PER_PEER + 1):  # memory stays bounded
        intake.check("r", i.to_bytes(100, "big"), 20_000 + i)


def test_a_persistent_attacker_is_banned_after_a_bounded_number_of_faults() -> None:
    for kind, points in FAULT_PENALTIES.items():
        book = PenaltyBook()
        faults = 0
        while not book.add("p", kind, points, now=0):  # a burst: no time to decay
            faults += 1
        assert faults + 1 == -(-PENALTY_BAN_THRESHOLD // points), kind
        assert book.is_banned("p", 0)


def test_limits_are_a_config_section_and_bad_values_are_named() -> None:
    sections = config_sections({})
    config = load_config({}, env={"SYMPHONY_LIMITS__REPLAY_ALLOWANCE": "5"},
                         sections=sections)
    assert config.section("limits") == NetLimits(replay_allowance=5)
    with pytest.raises(ConfigError, match="read_deadline_s"):
        load_config({}, env={"SYMPHONY_LIMITS__READ_DEADLINE_S": "0"}, sections=sections)


def test_status_lists_the_highest_penalty_scores_only() -> None:
    from node.penalties import STATUS_LISTED, PenaltyBook

    book = PenaltyBook()
    for n in range(STATUS_LISTED + 50):  # an attacker with many keys
        book.add(f"peer-{n}", "flood", 1 + n % 90, now=0)
    status = book.status(0)
    assert status["penalized_peers"] == STATUS_LISTED + 50
    assert len(status["penalties"]) == STATUS_LISTED
    assert min(r["score"] for r in status["penalties"].values()) >= \
        sorted(1 + n % 90 for n in range(STATUS_LISTED + 50))[50]


def test_status_lists_the_latest_bans_only_and_expired_bans_are_forgotten() -> None:
    from node.penalties import BAN_MS, STATUS_LISTED, PenaltyBook

    book = PenaltyBook()
    keys = STATUS_LISTED + 30  # an attacker with many keys, each banned in turn
    for n in range(keys):
        assert book.add(f"peer-{n}", "flood", PENALTY_BAN_THRESHOLD, now=n)
    status = book.status(keys)
    assert status["banned_peers"] == keys
    assert set(status["banned"]) == {f"peer-{n}" for n in range(30, keys)}  # the latest
    # once they have run out, the next ban forgets them: the table does not grow for ever
    later = keys + BAN_MS
    assert book.add("fresh", "flood", PENALTY_BAN_THRESHOLD, now=later)
    assert list(book.banned_until) == ["fresh"]
    assert book.status(later)["banned_peers"] == book.banned_count(later) == 1


def test_an_attacker_past_the_record_cap_cannot_push_out_its_own_keys_records() -> None:
    """Thousands of keys banned already, and banned keys whose frames in flight kept
    costing points: eight fresh keys faulting in turn must each still be banned at 100."""
    from node.penalties import MAX_PENALIZED_PEERS

    book = PenaltyBook()
    for n in range(MAX_PENALIZED_PEERS):
        assert book.add(f"old-{n}", "undecodable", PENALTY_BAN_THRESHOLD, now=0)
        book.add(f"old-{n}", "undecodable", 50, now=0)  # in flight after its ban: nothing
    assert book.score("old-0") == 0.0
    banned = set()
    for _ in range(10):
        for key in range(8):  # round robin, as concurrent attackers interleave
            if book.add(f"new-{key}", "undecodable", 10, now=1):
                banned.add(key)
    assert banned == set(range(8))
    assert len(book.records) <= MAX_PENALIZED_PEERS
