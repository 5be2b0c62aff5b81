"""Real daemons as separate processes on 127.0.0.1, port 0: discovery, crash, rejoin, refusal,
garbage, and shutdown under gossip load. Helpers: tests/node/conftest.py, node/testnet.py."""

from __future__ import annotations

import hashlib
import json
import signal
from datetime import datetime
from typing import Any

import pytest
import trio

from node.daemon import EXIT_FORCED, SHUTDOWN_DEADLINE_S
from node.driver import HANDSHAKE_PROTOCOL_ID, INVALID_MESSAGE_PENALTY
from node.p2p.host import open_p2p
from node.penalties import FAULT_PENALTIES
from node.transport import TransportError
from protocol.names import protocol_id

from .conftest import (
    CONVERGE_S,
    FAILS_ON_SHUTDOWN,
    GOSSIP_PROBE,
    STUCK_ON_SHUTDOWN,
    TEST_NETWORK_ID,
    Testnet,
    run_cli,
)

pytestmark = pytest.mark.integration

#: the promise: graceful shutdown within 5 s of SIGTERM. The daemon keeps it itself: a stop
#: still running SHUTDOWN_DEADLINE_S after the signal is forced (EXIT_FORCED), so the tests
#: read the outcome from the exit status and the daemon's own log times, not from this
#: process's clock, which a loaded machine stretches by however long it takes to reap a child
SHUTDOWN_S = 5.0
#: bound on waiting for a stopping daemon's process to exit
EXIT_WAIT_S = 30.0


def logged_at_s(event: dict[str, Any]) -> float:
    """When the daemon logged ``event`` (its ISO-8601 UTC timestamp), in epoch seconds."""
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def test_the_forced_exit_deadline_keeps_the_promise() -> None:
    assert SHUTDOWN_DEADLINE_S < SHUTDOWN_S


def test_three_daemons_discover_each_other_survive_a_crash_and_rejoin(testnet: Testnet) -> None:
    a, b, c = testnet.start_many(["a", "b", "c"])
    testnet.wait_all_connected(CONVERGE_S)  # C knew only A: it met B by peer exchange

    status = a.status()
    assert status["peer_id"] == a.peer_id
    assert status["addresses"] and all(
        addr.endswith(f"/p2p/{a.peer_id}") for addr in status["addresses"])
    assert {p["peer_id"] for p in status["peers"]} == {b.peer_id, c.peer_id}
    assert status["uptime_s"] > 0 and status["versions"]["protocol"] == 1
    assert "/p2p/" in c.status()["peers"][0]["addrs"][0]
    testnet.wait_until(
        lambda: all(p["latency_ms"] is not None for p in a.status()["peers"]),
        "a to measure the latency of both peers", CONVERGE_S)

    # the CLI finds the daemon through its data dir
    shown = run_cli("node", "status", "--json", data_dir=b.data_dir)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["peer_id"] == b.peer_id

    # kill -9 C: A and B notice it gone and say why
    c_id = c.peer_id
    c.kill()
    testnet.wait_until(
        lambda: all(c_id not in x.ready_peers() for x in (a, b)), "a and b to drop c",
        CONVERGE_S)
    assert any(d["peer_id"] == c_id for d in a.status()["dropped"])
    stale = run_cli("node", "status", data_dir=c.data_dir)
    assert stale.returncode != 0 and "stale" in stale.stderr

    # restart with the same data dir: same peer id, and it rejoins both
    c.restart()
    assert c.peer_id == c_id
    testnet.wait_all_connected(CONVERGE_S)


def test_a_node_of_another_network_is_refused_with_a_clear_log_line(testnet: Testnet) -> None:
    a = testnet.start("a")
    x = testnet.start("x", bootstrap=[a], network_id="othernet")

    def refusal() -> list[dict[str, object]]:
        return [e for e in a.log_events("membership.peer_refused") if e["peer"] == x.peer_id]

    (line,) = testnet.wait_until(refusal, "a to refuse x", CONVERGE_S)
    assert "'othernet'" in str(line["reason"]) and f"'{TEST_NETWORK_ID}'" in str(line["reason"])
    assert line["peer_id"] == a.peer_id  # every line is bound to the node's own peer id
    testnet.wait_until(lambda: any(d["peer_id"] == x.peer_id for d in a.status()["dropped"]),
                       "a to record why x was dropped", CONVERGE_S)
    assert a.ready_peers() == set() and x.ready_peers() == set()


def test_garbage_on_the_request_protocol_is_logged_with_the_peer_and_the_node_survives(
        testnet: Testnet) -> None:
    a = testnet.start("a")
    frames = [b"\xff" * 64, b"", b"\x93\x01\x01", b"\x92\xcc\x01\x01" + b"\x00" * 10]

    async def attack() -> tuple[str, list[bytes]]:
        with trio.fail_after(CONVERGE_S):
            seed = hashlib.sha256(b"garbage-sender").digest()
            async with open_p2p(seed, listen=["/ip4/127.0.0.1/tcp/0"]) as transport:
                peer = await transport.connect(a.addresses[0])
                replies = []
                for protocol in (protocol_id(TEST_NETWORK_ID, "msg"), HANDSHAKE_PROTOCOL_ID):
                    for frame in frames:
                        replies.append(await transport.request(
                            peer, protocol, frame, max_response_bytes=256))
                # a frame that announces more than the limit is cut off by the transport
                with pytest.raises(TransportError):
                    await transport.request(peer, protocol_id(TEST_NETWORK_ID, "msg"),
                                            b"\x00" * (2 << 20), max_response_bytes=256)
                return transport.peer_id, replies

    attacker, replies = trio.run(attack)
    assert replies == [b"invalid message"] * (2 * len(frames))
    status = a.status()  # still serving
    penalty = status["penalties"][attacker]
    # every invalid frame, and the oversized one the transport cut off, cost points
    assert penalty["total"] == (2 * len(frames) * INVALID_MESSAGE_PENALTY
                                + FAULT_PENALTIES["oversize"])
    logged = [e for e in a.log_events("driver.penalized") if e["peer"] == attacker]
    # logged once for the peer and kind, every one counted (penalty total above)
    assert [str(e["reason"]).split(":")[0] for e in logged] == ["invalid message", "oversize"]
    assert a.running
    # and it still makes friends
    b = testnet.start("b", bootstrap=[a])
    testnet.wait_until(lambda: b.peer_id in a.ready_peers(), "a to accept b", CONVERGE_S)


def test_sigterm_under_gossip_load_exits_cleanly_within_five_seconds(testnet: Testnet) -> None:
    probe = {"extra_services": [GOSSIP_PROBE]}
    a, b = testnet.start_many(["a", "b"], config=probe)
    testnet.wait_until(
        lambda: all(n.status()["services"]["probe"]["received"] > 100 for n in (a, b)),
        "gossip to flow both ways", CONVERGE_S)

    a.send_stop()
    b.send_stop()
    codes = (a.terminate(timeout_s=EXIT_WAIT_S), b.terminate(timeout_s=EXIT_WAIT_S))
    # exit status 0: each stop beat the daemon's own forced-exit timer, which fires
    # SHUTDOWN_DEADLINE_S after the signal and exits with EXIT_FORCED
    assert codes == (0, 0), a.log_tail() + b.log_tail()
    for node in (a, b):
        assert not node.log_events("daemon.forced_exit"), node.log_tail()
        [signalled], [stopped] = node.log_events("daemon.signal"), node.log_events("daemon.stopped")
        assert logged_at_s(stopped) - logged_at_s(signalled) < SHUTDOWN_DEADLINE_S
        assert not (node.data_dir / "daemon.json").exists()


def test_a_stuck_shutdown_is_forced_at_the_deadline_or_by_a_second_signal(
        testnet: Testnet) -> None:
    a, b = testnet.start_many(["a", "b"], config={"extra_services": [STUCK_ON_SHUTDOWN]})
    assert a.proc is not None
    a.send_stop(signal.SIGINT)
    testnet.wait_until(lambda: a.log_events("daemon.signal"), "a to take the first SIGINT",
                       CONVERGE_S)
    a.proc.send_signal(signal.SIGINT)
    assert a.terminate(timeout_s=EXIT_WAIT_S) == EXIT_FORCED
    # the second signal ended it, not the deadline timer (which would say so)
    [forced] = a.log_events("daemon.forced_exit")
    assert forced["why"] == "second SIGINT", forced

    b.send_stop()
    assert b.terminate(timeout_s=EXIT_WAIT_S) == EXIT_FORCED
    [signalled], [forced] = b.log_events("daemon.signal"), b.log_events("daemon.forced_exit")
    assert forced["why"] == "shutdown deadline", forced
    # on the daemon's own clock: not before the deadline (the upper bound is the timer's)
    assert logged_at_s(forced) - logged_at_s(signalled) >= SHUTDOWN_DEADLINE_S


def test_an_error_while_stopping_is_logged_and_the_stop_stays_clean(testnet: Testnet) -> None:
    [a] = testnet.start_many(["a"], config={"extra_services": [FAILS_ON_SHUTDOWN]})
    assert a.terminate(timeout_s=EXIT_WAIT_S) == 0  # 0: clean, and within the deadline
    [event] = a.log_events("daemon.error_during_shutdown")
    assert "peer went away mid-shutdown" in event["error"]
