"""node/inference: the block server and the chain client over in-memory streams (tiny model).

The daemons' end-to-end path (libp2p, the ledger, kill -9) is in
tests/node/test_inference_integration.py; here the server, the client, recovery and bad
servers run in one trio loop, fast."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
import trio
import trio.testing

pytest.importorskip("torch")
pytest.importorskip("gguf")

import torch  # noqa: E402

from models.blocks import LocalTarget, greedy, load_head, load_stage  # noqa: E402
from node.inference.client import Chain, ChainError, ChainTarget, Directory  # noqa: E402
from node.inference.server import StageHost  # noqa: E402
from node.inference.wire import SessionStream, pack_hidden  # noqa: E402
from protocol.inference.messages import (  # noqa: E402
    Forward,
    ForwardResult,
    Precision,
    SessionError,
)
from protocol.inference.routing import Server  # noqa: E402
from protocol.inference.session import ServedBlocks, SessionLimits, SessionServer  # noqa: E402
from protocol.machine import Received  # noqa: E402
from tests.models import tiny  # noqa: E402

PROMPT = [5, 17, 33, 99, 100, 7]
MODEL = "tiny"


class MemStream:
    """A node.transport.BulkStream over one end of a trio memory stream pair."""

    def __init__(self, stream: Any, peer: str) -> None:
        self.s, self._peer = stream, peer

    @property
    def peer_id(self) -> str:
        return self._peer

    async def read(self, max_bytes: int) -> bytes:
        try:
            return bytes(await self.s.receive_some(max_bytes))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def write(self, data: bytes) -> None:
        from node.transport import StreamGone

        try:
            await self.s.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamGone(str(exc)) from exc

    async def close(self) -> None:
        await self.s.aclose()

    async def reset(self) -> None:
        await self.s.aclose()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return tiny.write_gguf(tiny.tiny_model(seed=3), tmp_path_factory.mktemp("chain") / "t.gguf")


class Net:
    """Block servers by peer name, each a StageHost; streams are memory pairs."""

    def __init__(self, gguf: Path, nursery: trio.Nursery) -> None:
        self.gguf, self.nursery = gguf, nursery
        self.hosts: dict[str, StageHost] = {}
        self.reports: list[tuple[str, str]] = []
        self.tamper: dict[str, Callable[[Any], Any]] = {}
        self.streams: dict[str, list[MemStream]] = {}

    def serve(self, peer: str, start: int, end: int, limits: SessionLimits | None = None) -> None:
        stage = load_stage(self.gguf, start, end)
        served = ServedBlocks(MODEL, start, end, stage.hidden_size,
                              stage.bytes_per_position // (end - start))
        self.hosts[peer] = StageHost(stage, SessionServer(served, limits or SessionLimits()),
                                     clock=lambda: int(trio.current_time() * 1000),
                                     report=self.report, log=structlog.get_logger())

    async def report(self, peer: str, detail: str) -> None:
        self.reports.append((peer, detail))

    def servers(self) -> list[Server]:
        return [Server(p, MODEL, h.stage.start, h.stage.end, 1.0, 8, 16, 1 << 30)
                for p, h in sorted(self.hosts.items())]

    async def open_stream(self, peer: str) -> SessionStream:
        if peer not in self.hosts:
            from node.transport import TransportError

            raise TransportError(f"{peer} is gone")
        client, server = trio.testing.memory_stream_pair()
        host = self.hosts[peer]
        if peer in self.tamper:
            host = self.tamper[peer](host)
        self.nursery.start_soon(host.serve, "requester", MemStream(server, "requester"))
        mem = MemStream(client, peer)
        self.streams.setdefault(peer, []).append(mem)
        return SessionStream(mem)

    def chain(self, precision: Precision = Precision.FP16) -> Chain:
        return Chain(Directory(self.servers, self.open_stream, self.report), model=MODEL,
                     n_blocks=tiny.LAYERS, hidden_size=tiny.HIDDEN, max_length=128,
                     precision=precision)


def run_chain(gguf: Path, body: Callable[[Net], Any]) -> Any:
    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            net = Net(gguf, nursery)
            result = await body(net)
            nursery.cancel_scope.cancel()
            return result

    return trio.run(main)


def reference(gguf: Path, n: int = 64) -> list[int]:
    return greedy(LocalTarget.from_gguf(gguf), PROMPT, n)


async def generate(net: Net, chain: Chain, n: int = 64) -> tuple[list[int], list[str]]:
    """Greedy tokens through ``chain`` and the peers of its final route."""
    await chain.open()
    target = ChainTarget(load_head(net.gguf), chain)
    out = await trio.to_thread.run_sync(greedy, target, PROMPT, n)
    route = [peer for peer, _, _ in chain.route]
    await chain.close()
    return out, route


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.FP32])
def test_two_stage_chain_is_token_identical(gguf: Path, precision: Precision) -> None:
    async def body(net: Net) -> list[int]:
        net.serve("a", 0, 1)
        net.serve("b", 1, 2)
        chain = net.chain(precision)
        out, route = await generate(net, chain)
        assert route == ["a", "b"] and chain.recoveries == 0
        return out

    assert run_chain(gguf, body) == reference(gguf)


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
        assert [h[0] for h in chain.route] == ["a", "b"]
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

        async def kill(peer: str) -> None:
            del net.hosts[peer]
            for s in net.streams[peer]:
                await s.close()

        out = await trio.to_thread.run_sync(decode)
        await chain.close()
        return out, chain

    out, chain = run_chain(gguf, body)
    assert out == reference(gguf, 40)
    assert chain.recoveries == 1 and "b" in chain.excluded


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
        net.tamper["a"] = NanHost
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
        reply = await s.stream.receive()
        assert isinstance(reply, SessionError) and reply.reason.value == "malformed"
        assert net.reports and net.reports[-1][0] == "requester"
        assert not net.hosts["a"].machine.sessions and not net.hosts["a"].caches

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
                nursery.start_soon(net.hosts["a"].serve, "requester", MemStream(server, "r"))
                await client.send_all(frame)
        assert [p for p, _ in net.reports] == ["requester"]
        assert fault in net.reports[0][1]

    run_chain(gguf, body)
