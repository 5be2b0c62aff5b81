"""The guard is a layer of the host: a handler py-libp2p registers after the host was built
(as pubsub does when it starts) runs behind it as py-libp2p's, raw garbage it fails on costs
the peer points instead of killing the process, and our own handlers (``GuardedHost.serve``)
are guarded as ours. The streams here are doubles (tests/node/test_guard_identify.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import trio
from google.protobuf.message import DecodeError
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol

from node.p2p.frame_checks import libp2p_framings
from node.p2p.guard import GuardedHost, StreamGuard
from node.p2p.swarm import build_host
from node.runtime.limits import NetLimits
from tests.node.fake_streams import IdentifyStream, NullLog
from tests.node.trio_support import Faults

LIMITS = NetLimits(read_deadline_s=2.0)
LATE = "/late/1.0.0"


def _guarded_host(faults: Faults) -> GuardedHost:
    host = build_host(create_new_key_pair(hashlib.sha256(b"guard-layer").digest()), LIMITS)
    guard = StreamGuard(LIMITS, NullLog(), lambda: int(trio.current_time() * 1000),
                        libp2p_framings(LIMITS))
    guard.on_fault = faults
    return GuardedHost(host, guard)


def test_every_handler_on_the_host_is_guarded_even_those_registered_after_it_was_built() -> None:
    guarded = _guarded_host(Faults())
    handlers = guarded.host.multiselect.handlers
    # py-libp2p's own (ping, identify, identify push), present when the host was built
    assert handlers and all(guarded.guard.guards(h) for h in handlers.values())

    async def late(stream: Any) -> None:
        raise DecodeError("not a protobuf")

    guarded.host.set_stream_handler(TProtocol(LATE), late)
    assert handlers[TProtocol(LATE)] is not late and guarded.guard.guards(handlers[LATE])


def test_raw_garbage_a_late_libp2p_handler_fails_on_costs_points_not_the_process() -> None:
    async def main() -> None:
        faults = Faults()
        guarded = _guarded_host(faults)

        async def late(stream: Any) -> None:
            raise DecodeError("not a protobuf")  # as pubsub's reader lets it out

        guarded.host.set_stream_handler(TProtocol(LATE), late)
        peer = guarded.host.get_id()
        stream = IdentifyStream(peer, None, sent=b"\xff" * 64)
        with trio.fail_after(10):
            await guarded.host.multiselect.handlers[LATE](stream)  # raises nothing
        assert stream.was_reset
        assert [kind for kind, _ in faults.seen] == ["undecodable"]
        assert dict(guarded.guard.faults) == {"undecodable": 1}

    trio.run(main)


def test_our_handlers_are_guarded_as_ours() -> None:
    async def main() -> None:
        faults = Faults()
        guarded = _guarded_host(faults)

        async def ours(stream: Any) -> None:
            raise RuntimeError("our bug")  # no peer's bytes explain it

        guarded.serve(LATE, ours)
        handler = guarded.host.multiselect.handlers[LATE]
        stream = IdentifyStream(guarded.host.get_id(), None)
        with trio.fail_after(10):
            await handler(stream)
        # ours: our bug is counted as ours and costs the peer nothing (a handler guarded as
        # py-libp2p's would have charged the peer "invalid")
        assert stream.was_reset and faults.seen == []
        assert dict(guarded.guard.faults) == {"handler_failed": 1}

    trio.run(main)
