"""node/inference: the block server and the chain client over in-memory streams (tiny model).

The daemons' end-to-end path (libp2p, the ledger, kill -9) is in
tests/node/test_inference_integration.py; here the server, the client, recovery and bad
servers run in one trio loop, fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

pytest.importorskip("torch")
pytest.importorskip("gguf")

from models.blocks import LocalTarget, greedy, load_head  # noqa: E402
from node.inference.chain import Chain, ChainError, ChainTarget  # noqa: E402
from node.inference.local import local_pair  # noqa: E402
from node.inference.server import StageHost  # noqa: E402
from node.inference.wire import SessionStream, pack_hidden  # noqa: E402
from node.transport import StreamGone  # noqa: E402
from protocol.inference.forwarding import SendHandoff  # noqa: E402
from protocol.inference.messages import (  # noqa: E402
    Forward,
    ForwardResult,
    Handoff,
    HandoffRejected,
    Precision,
    SessionError,
)
from protocol.inference.session import SessionLimits  # noqa: E402
from protocol.machine import Received, Send  # noqa: E402
from tests.models import tiny  # noqa: E402
from tests.node import chain_net  # noqa: E402
from tests.node.chain_net import (  # noqa: E402
    PROMPT,
    MemStream,
    Net,
    generate,
    peer_of,
    reference,
    run_chain,
)

gguf = chain_net.gguf  # the tiny model's fixture (module scope)



@pytest.mark.parametrize(("precision", "forwarding"), [
    (Precision.FP16, True), (Precision.FP32, True), (Precision.FP16, False)])
def test_two_stage_chain_is_token_identical(gguf: Path, precision: Precision,
                                            forwarding: bool) -> None:
    async def body(net: Net) -> list[int]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        chain = net.chain(precision, forwarding)
        out, route = await generate(net, chain)
        assert route == ["a", "b"] and chain.recoveries == 0
        # forwarded: a hands off to b over a's own stream; direct: the requester talks to both
        assert ((peer_of("a"), peer_of("b")) in net.opened) == forwarding
        assert not any(h.links for h in net.hosts.values())  # closed with the sessions
        return out

    assert run_chain(gguf, body) == reference(gguf)


@pytest.mark.parametrize("me", ["a", "b"])
def test_a_requester_that_serves_blocks_is_a_hop_of_its_own_chain(gguf: Path, me: str) -> None:
    """The requester ``me`` serves a stage too: its own hop is reached over an in-process stream
    (node.inference.local) and the other stage hands off to it, or it hands off to the other, as between
    remote stages; the output is the single-process model's."""

    async def body(net: Net) -> list[int]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        own = peer_of(me)

        async def open_stream(peer: str) -> SessionStream:
            if peer != own:
                return await net.open_stream(peer, sender=own)
            mine, theirs = local_pair(own)
            net.nursery.start_soon(net.hosts[own].serve, own, theirs)
            return SessionStream(mine)

        chain = net.chain()
        chain.directory = dataclasses.replace(chain.directory, open_stream=open_stream,
                                              rtt_ms=lambda: {own: 0.0})
        out, route = await generate(net, chain)
        assert route == ["a", "b"] and chain.recoveries == 0 and not net.reports
        # the other stage was reached over the "network", the own one never
        assert (own, peer_of("b" if me == "a" else "a")) in net.opened
        assert all(peer != own for sender, peer in net.opened if sender == own)
        assert net.hosts[own].forwards > 0 and not net.hosts[own].machine.sessions
        return out

    assert run_chain(gguf, body) == reference(gguf)


def test_a_local_stream_ends_and_resets_like_a_network_one() -> None:
    async def main() -> None:
        mine, theirs = local_pair("me")
        await mine.write(b"hello")
        assert await theirs.read(3) == b"hel" and await theirs.read(10) == b"lo"
        await mine.close()
        assert await theirs.read(10) == b""  # our sending side ended
        await theirs.write(b"still")  # theirs is open until it closes
        assert await mine.read(10) == b"still"
        await theirs.reset()
        with pytest.raises(StreamGone):
            await mine.write(b"x")  # nobody reads any more
        assert mine.peer_id == theirs.peer_id == "me"

    trio.run(main)


class GarbageRelayHost(StageHost):
    """Hands off NaN hidden states (signed: the frame is its own)."""

    async def _hand_off(self, out: SendHandoff) -> list[Any]:
        bad = np.full((out.n, tiny.HIDDEN), np.nan, np.float32).astype("<f2").tobytes()
        return await super()._hand_off(dataclasses.replace(out, data=bad))


class FalseReporterHost(StageHost):
    """Reports every handoff it gets as bad, with the (good) frame as evidence."""

    async def serve(self, peer: str, raw: Any) -> None:
        handle = self.machine.handle

        def lying(event: Any, now: int) -> list[Any]:
            msg = getattr(event, "message", None)
            if isinstance(msg, Handoff):
                opener = self.machine.sessions[msg.session_id].peer
                return [Send(opener, HandoffRejected(session_id=msg.session_id,
                                                     sender=event.peer, handoff=msg,
                                                     detail="says it is bad"))]
            return handle(event, now)

        self.machine.handle = lying  # type: ignore[method-assign]
        await super().serve(peer, raw)


@pytest.mark.parametrize(("host", "culprit"), [(GarbageRelayHost, "a"),
                                               (FalseReporterHost, "b")])
def test_a_bad_handoff_is_blamed_on_the_stage_at_fault(gguf: Path, host: type,
                                                      culprit: str) -> None:
    """The stage that hands off garbage, or the one that falsely reports a good handoff, is the
    one penalized and replaced; the output is unchanged."""

    async def body(net: Net) -> tuple[list[int], Net, Chain]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        net.serve("c", 1, 2) if culprit == "b" else net.serve("c", 0, 1)
        bad = net.hosts[peer_of(culprit)]
        bad.__class__ = host
        chain = net.chain()
        out, route = await generate(net, chain, 16)
        assert culprit not in route and chain.recoveries >= 1
        return out, net, chain

    out, net, chain = run_chain(gguf, body)
    assert out == reference(gguf, 16)
    assert {p for p, _ in net.reports} == {culprit}
    assert chain.excluded == {peer_of(culprit)}


def test_rollback_then_forward_matches(gguf: Path) -> None:
    async def body(net: Net) -> tuple[np.ndarray, np.ndarray]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        chain = net.chain(Precision.FP32)
        await chain.open()
        target = ChainTarget(load_head(gguf), chain)
        first = await trio.to_thread.run_sync(target.forward, PROMPT + [1, 2, 3], 0)
        target.rollback(len(PROMPT))
        again = await trio.to_thread.run_sync(target.forward, [1, 2, 3], len(PROMPT))
        await chain.close()
        return first[len(PROMPT):], again

    first, again = run_chain(gguf, body)
    np.testing.assert_allclose(again, first, atol=1e-4)


def test_a_failed_server_is_replaced_and_the_output_is_unchanged(gguf: Path) -> None:
    async def body(net: Net) -> tuple[list[int], Chain]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        net.serve("c", 1, 2)  # the replacement for b's span
        chain = net.chain()
        await chain.open()
        assert [net.name(h[0]) for h in chain.route] == ["a", "b"]
        target = ChainTarget(load_head(gguf), chain)

        def decode() -> list[int]:
            out: list[int] = []
            logits = target.forward(PROMPT, 0)
            for i in range(40):
                out.append(int(np.argmax(logits[-1])))
                if i == 20:  # b dies mid-generation: its stream breaks, it is gone
                    trio.from_thread.run(kill, "b")
                logits = target.forward([out[-1]], len(PROMPT) + i)
            return out

        async def kill(name: str) -> None:
            peer = peer_of(name)
            del net.hosts[peer]
            for s in net.streams[peer]:
                await s.close()

        out = await trio.to_thread.run_sync(decode)
        await chain.close()
        return out, chain

    out, chain = run_chain(gguf, body)
    assert out == reference(gguf, 40)
    assert chain.recoveries == 1 and peer_of("b") in chain.excluded


def test_a_server_sending_nan_is_penalized_and_replaced(gguf: Path) -> None:
    class NanHost:
        def __init__(self, host: StageHost) -> None:
            self.host = host

        async def serve(self, peer: str, raw: MemStream) -> None:
            stream = SessionStream(raw)
            opened = await stream.receive()
            effects = self.host.machine.handle(Received(peer, opened), 0)
            await self.host._perform(peer, stream, effects)
            msg = await stream.receive()
            assert isinstance(msg, Forward)
            bad = np.full((msg.n, tiny.HIDDEN), np.nan, np.float32).astype("<f2").tobytes()
            await stream.send(ForwardResult(session_id=msg.session_id, start_pos=msg.start_pos,
                                            n=msg.n, data=bad, compute_ms=1))

    async def body(net: Net) -> tuple[list[int], Net]:
        net.serve("a", 0, 2)
        net.serve("z", 0, 2)
        net.tamper[peer_of("a")] = NanHost
        out, route = await generate(net, net.chain(), 16)
        assert route == ["z"]
        return out, net

    out, net = run_chain(gguf, body)
    assert out == reference(gguf, 16)
    assert [p for p, _ in net.reports] == ["a"] and "non-finite" in net.reports[0][1]


def test_no_server_left_is_a_clear_error(gguf: Path) -> None:
    async def body(net: Net) -> None:
        net.serve("a", 0, 1)
        with pytest.raises(ChainError, match="covers block 1"):
            await net.chain().open()

    run_chain(gguf, body)


def test_server_refuses_over_its_limits_and_penalizes_bad_frames(gguf: Path) -> None:
    async def body(net: Net) -> None:
        net.serve("a", 0, 2, SessionLimits(max_sessions=1, max_tokens_per_session=64))
        first = net.chain()
        first.max_length = 200  # over the server's tokens per session
        with pytest.raises(ChainError, match="refused: too_long"):
            await first.open()
        ok = net.chain()
        ok.max_length = 64
        await ok.open()
        second = net.chain()
        second.max_length = 64
        with pytest.raises(ChainError, match="sessions_full"):  # one session per server
            await second.open()
        s = ok.hops[0]
        await s.stream.send(Forward(session_id=s.session_id, start_pos=0, n=2,
                                    data=pack_hidden(np.zeros((1, tiny.HIDDEN)), Precision.FP16)))
        assert ok.inbox is not None
        _, reply = await ok.inbox.next()  # the chain's reader has the stream
        assert isinstance(reply, SessionError) and reply.reason.value == "malformed"
        assert net.reports and net.reports[-1][0] == "requester"
        host = net.hosts[peer_of("a")]
        assert not host.machine.sessions and not host.caches

    run_chain(gguf, body)


def test_link_delay_holds_every_outgoing_frame() -> None:
    async def main() -> float:
        client, server = trio.testing.memory_stream_pair()
        delayed = SessionStream(MemStream(client, "b"), delay_ms=40)
        plain = SessionStream(MemStream(server, "a"))
        t0 = trio.current_time()
        await delayed.send(Forward(session_id=b"x" * 16, start_pos=0, n=1, data=b"\0\0"))
        await plain.receive()
        return trio.current_time() - t0

    elapsed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert elapsed == pytest.approx(0.040)


@pytest.mark.parametrize(("frame", "fault"), [
    ((1 << 21).to_bytes(4, "big"), "oversized"),  # announces a frame over the 1 MiB limit
    ((3).to_bytes(4, "big") + b"\xc1\xc1\xc1", "undecodable"),  # bytes that are no message
])
def test_a_bad_frame_from_a_requester_is_reported(gguf: Path, frame: bytes, fault: str) -> None:
    async def body(net: Net) -> None:
        net.serve("a", 0, 2)
        client, server = trio.testing.memory_stream_pair()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(net.hosts[peer_of("a")].serve, "requester",
                                   MemStream(server, "r"))
                await client.send_all(frame)
        assert [p for p, _ in net.reports] == ["requester"]
        assert fault in net.reports[0][1]

    run_chain(gguf, body)


def test_a_silent_stream_ends_after_the_idle_timeout_unless_its_session_is_open(
        gguf: Path) -> None:
    """A stream with no open session ends once silent for the idle timeout; the opener's
    stream of a forwarded session (fed by handoffs, silent itself) stays while it is open."""

    async def body(net: Net) -> None:
        net.serve("a", 0, 2, SessionLimits(idle_timeout_ms=1000))
        host = net.hosts[peer_of("a")]
        client, server = trio.testing.memory_stream_pair()
        with trio.fail_after(20):
            await host.serve("requester", MemStream(server, "r"))  # returns: it idled out
        chain = net.chain()
        await chain.open()
        sid = chain.hops[0].session_id
        host.machine.sessions[sid].last_active_ms = 10**12  # the machine keeps it open
        await trio.sleep(2.5)
        assert not chain.hops[0].closed and sid in host.openers
        await chain.close()

    run_chain(gguf, body)


def test_steps_run_on_the_event_loop_and_long_or_slow_work_in_a_thread(gguf: Path) -> None:
    """A step of a few positions on a stage seen to be fast runs on the event loop (no thread
    wake-ups); a prefill over INLINE_MAX_POSITIONS in a worker thread, and so do the steps of
    a stage measured slow until one is seen fast. The output is the same either way."""
    import threading

    from node.inference.server import INLINE_MAX_MS, INLINE_MAX_POSITIONS

    prompt = [(7 * i) % 200 + 3 for i in range(INLINE_MAX_POSITIONS + 4)]

    async def body(net: Net) -> tuple[list[int], list[tuple[str, int, bool]]]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        net.hosts[peer_of("b")].ms_per_block = INLINE_MAX_MS + 1  # measured slow at start
        loop = threading.get_ident()
        seen: list[tuple[str, int, bool]] = []
        for peer, host in net.hosts.items():
            def spy(x: np.ndarray, *args: Any, _forward: Any = host.stage.forward,
                    _name: str = net.name(peer)) -> np.ndarray:
                seen.append((_name, len(x), threading.get_ident() == loop))
                return _forward(x, *args)

            host.stage.forward = spy  # type: ignore[method-assign]
        chain = net.chain()
        await chain.open()
        target = ChainTarget(load_head(gguf), chain)
        out = await trio.to_thread.run_sync(greedy, target, prompt, 8)
        await chain.close()
        return out, seen

    out, seen = run_chain(gguf, body)
    assert out == greedy(LocalTarget.from_gguf(gguf), prompt, 8)
    n = len(prompt)
    assert [s for s in seen if s[0] == "a"] == [("a", n, False)] + [("a", 1, True)] * 7
    # b's first step shows it fast (the tiny model): the next ones run on the event loop
    assert [s for s in seen if s[0] == "b"] == [("b", n, False), ("b", 1, False)] + [
        ("b", 1, True)] * 6
