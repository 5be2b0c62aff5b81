"""Identify behind the stream guard: a peer that hangs up while we answer costs nothing, one
that writes on identify (the asking side must send nothing) costs points. The streams here
are doubles that fail the way py-libp2p 0.8.1's do when the connection is gone."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.network.stream.exceptions import StreamReset
from libp2p.stream_muxer.exceptions import MuxedConnUnavailable

from node.p2p.guard import StreamGuard
from node.p2p.swarm import build_host, identify_handler
from node.runtime.limits import NetLimits
from tests.node.fake_streams import IDENTIFY, IdentifyStream, NullLog
from tests.node.trio_support import Faults

LIMITS = NetLimits(read_deadline_s=2.0)


def _guarded(faults: Faults) -> tuple[Any, Any]:
    host = build_host(create_new_key_pair(hashlib.sha256(b"guard-identify").digest()), LIMITS)
    guard = StreamGuard(LIMITS, NullLog(), lambda: int(trio.current_time() * 1000))
    guard.on_fault = faults
    handler = guard.wrap(IDENTIFY, identify_handler(host, "symphony-node/test", LIMITS),
                         ours=False)
    return host.get_id(), handler


@pytest.mark.parametrize(("write_error", "read_error"), [
    (MuxedConnUnavailable("Connection closed"), None),  # the connection went mid-answer
    (StreamReset(), StreamReset()),
    (None, MuxedConnUnavailable("Connection closed")),
])
def test_a_peer_hanging_up_mid_identify_costs_nothing(write_error: BaseException | None,
                                                      read_error: BaseException | None) -> None:
    async def main() -> None:
        faults = Faults()
        peer, handler = _guarded(faults)
        with trio.fail_after(10):
            await handler(IdentifyStream(peer, write_error, read_error=read_error))
        assert faults.seen == []

    trio.run(main)


def test_an_honest_identify_is_answered_and_bytes_from_the_asker_cost_points() -> None:
    async def main() -> None:
        faults = Faults()
        peer, handler = _guarded(faults)
        honest = IdentifyStream(peer, None)
        with trio.fail_after(10):
            await handler(honest)
            assert honest.written and faults.seen == []
            await handler(IdentifyStream(peer, None, sent=b"junk"))
        assert faults.kinds == ["undecodable"]

    trio.run(main)
