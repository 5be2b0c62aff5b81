"""The chain test bench shared by tests/node/test_inference_chain.py and
test_stage_checks.py: block servers of the tiny model (tests/models/tiny.py), each a
StageHost under its own key, and the chain client, over in-memory streams in one trio loop.
Import it after ``pytest.importorskip("torch")``: it builds the model with torch."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
import trio
import trio.testing

from crypto.keys import Identity
from models.blocks import LocalTarget, greedy, load_head, load_stage
from node.inference.chain import Chain, ChainTarget, Directory
from node.inference.server import StageHost
from node.inference.wire import SessionStream
from protocol.inference.messages import Precision
from protocol.inference.routing import Server
from protocol.inference.session import ServedBlocks, SessionLimits, SessionServer
from tests.models import tiny

PROMPT = [5, 17, 33, 99, 100, 7]
MODEL = "tiny"
NAMES = ("a", "b", "c", "z", "requester")


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


def peer_of(name: str) -> str:
    """The peer id of the test server called ``name`` (a real key: handoffs are signed)."""
    return identity_of(name).peer_id


def identity_of(name: str) -> Identity:
    return Identity.from_seed(name.encode().ljust(32, b"."))


class Net:
    """Block servers by name, each a StageHost under its own key; streams are memory pairs."""

    def __init__(self, gguf: Path, nursery: trio.Nursery) -> None:
        self.gguf, self.nursery = gguf, nursery
        self.hosts: dict[str, StageHost] = {}
        self.reports: list[tuple[str, str]] = []
        self.tamper: dict[str, Callable[[Any], Any]] = {}
        self.streams: dict[str, list[MemStream]] = {}
        self.opened: list[tuple[str, str]] = []  # (sender, peer) of every stream

    def serve(self, name: str, start: int, end: int, limits: SessionLimits | None = None,
              sign: Callable[[bytes], bytes] | None = None) -> None:
        stage = load_stage(self.gguf, start, end)
        served = ServedBlocks(MODEL, start, end, stage.hidden_size,
                              stage.bytes_per_position // (end - start))
        me = peer_of(name)
        self.hosts[me] = StageHost(stage, SessionServer(served, limits or SessionLimits()),
                                   clock=lambda: int(trio.current_time() * 1000),
                                   report=self.report, log=structlog.get_logger(),
                                   open_stream=partial(self.open_stream, sender=me),
                                   sign=sign or identity_of(name).sign)

    async def report(self, peer: str, detail: str) -> None:
        self.reports.append((self.name(peer), detail))

    @staticmethod
    def name(peer: str) -> str:
        return next((n for n in NAMES if peer_of(n) == peer), peer)

    def servers(self) -> list[Server]:
        return [Server(p, MODEL, h.stage.start, h.stage.end, 1.0, 8, 16, 1 << 30)
                for p, h in sorted(self.hosts.items(), key=lambda ph: self.name(ph[0]))]

    async def open_stream(self, peer: str, sender: str = "requester") -> SessionStream:
        if peer not in self.hosts:
            from node.transport import TransportError

            raise TransportError(f"{self.name(peer)} is gone")
        client, server = trio.testing.memory_stream_pair()
        host = self.hosts[peer]
        if peer in self.tamper:
            host = self.tamper[peer](host)
        self.nursery.start_soon(host.serve, sender, MemStream(server, sender))
        mem = MemStream(client, peer)
        self.streams.setdefault(peer, []).append(mem)
        self.opened.append((sender, peer))
        return SessionStream(mem)

    def chain(self, precision: Precision = Precision.FP16, forwarding: bool = True) -> Chain:
        return Chain(Directory(self.servers, self.open_stream, self.report,
                               spawn=self.nursery.start_soon), model=MODEL,
                     n_blocks=tiny.LAYERS, hidden_size=tiny.HIDDEN, max_length=128,
                     kv_bytes_per_block=2 * 4 * tiny.KV_HEADS * (tiny.HIDDEN // tiny.HEADS),
                     precision=precision, forwarding=forwarding)


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
    route = [net.name(peer) for peer, _, _ in chain.route]
    await chain.close()
    return out, route
