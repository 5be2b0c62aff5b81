"""The relay service in one process: real libp2p transports on loopback, the real driver.

A publisher and two peers: the artifact arrives intact and the hot-swap hook fires; a relay that
serves a corrupted chunk is penalized, its chunk never stored, and the peer below it re-attaches
to the publisher and completes.
"""

from __future__ import annotations

import io
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
import trio

from crypto.keys import Identity
from node.db import Database
from node.driver import Driver
from node.p2p.host import open_p2p
from node.relay.api import Publication
from node.relay.chunk_store import ChunkStore
from node.relay.service import RelaySection, RelayService
from node.service import NodeContext
from protocol.names import topic
from protocol.relay.manifest import RELAY_TOPIC, Manifest

NET = "relaytest"
CHUNK = 64 * 1024
SIZE = 40 * CHUNK + 123
WAIT_S = 60


class _Config:
    sections = {"relay": RelaySection(chunk_size=CHUNK, stall_timeout_ms=5000)}


@asynccontextmanager
async def relay_nodes(tmp_path: Path, n: int) -> AsyncIterator[list[RelayService]]:
    async with AsyncExitStack() as stack:
        ids = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(n)]
        transports = [await stack.enter_async_context(open_p2p(i.seed)) for i in ids]
        nursery = await stack.enter_async_context(trio.open_nursery())
        services = []
        for i, (ident, tr) in enumerate(zip(ids, transports, strict=True)):
            log = structlog.get_logger().bind(peer_id=ident.peer_id)
            driver = Driver(tr, network_id=NET, log=log)
            data_dir = tmp_path / f"n{i}"
            data_dir.mkdir()
            ctx = NodeContext(identity=ident, network_id=NET, data_dir=data_dir, config=_Config(),
                              db=Database(data_dir / "node.db"), transport=tr, log=log,
                              rng=random.Random(i), clock=driver.now_ms, submit=driver.submit,
                              services=driver.services)
            service = RelayService(ctx)
            await service.start()
            driver.add_service(service)
            driver.install()
            await nursery.start(driver.run)
            await nursery.start(service.run)
            service.driver = driver  # type: ignore[attr-defined]  # for the test's asserts
            services.append(service)
        with trio.fail_after(WAIT_S):
            for i in range(n):
                for j in range(i):
                    await transports[i].connect(transports[j].listen_addrs()[0])
            for a in transports:
                for b in transports:
                    if a is not b:
                        await a.wait_topic_peer(topic(NET, RELAY_TOPIC), b.peer_id)
        try:
            yield services
        finally:
            nursery.cancel_scope.cancel()


def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(random.Random(3).randbytes(SIZE))
    return path


def test_publish_reaches_both_peers_and_fires_the_hook(tmp_path: Path) -> None:
    async def main() -> None:
        async with relay_nodes(tmp_path, 3) as (pub, a, b):
            swapped: list[Manifest] = []
            b.on_version_complete(lambda m: swapped.append(m))
            manifest = await pub.publish(Publication(artifact(tmp_path), "w"))
            with trio.fail_after(WAIT_S):
                for peer in (a, b):
                    assert (await peer.wait_version("w")).id == manifest.id
            assert [m.id for m in swapped] == [manifest.id]
            out = tmp_path / "out.bin"
            await b.export(manifest, out)
            assert out.read_bytes() == artifact(tmp_path).read_bytes()
            assert a.status()["bytes_in"] == b.status()["bytes_in"] == SIZE
            assert not a.pending and not b.pending  # no verified chunk left unstored

    trio.run(main)


def test_a_relay_serving_a_corrupt_chunk_is_routed_around(tmp_path: Path) -> None:
    async def main() -> None:
        async with relay_nodes(tmp_path, 3) as (pub, a, b):
            for relay in (a, b):  # whichever the plan puts in the middle lies about chunk 5
                real_open = relay.store.open_chunk

                def lying_open(h: bytes, real: Any = real_open) -> Any:
                    data = bytearray(real(h).read())
                    if h == relay_hashes[5]:
                        data[0] ^= 0xFF
                    return io.BytesIO(bytes(data))

                relay.store.open_chunk = lying_open  # type: ignore[method-assign]
            attested: list[tuple[str, str, int]] = []
            for relay in (a, b):  # what each would put in the ledger
                async def record(attestations: list[Any]) -> None:
                    attested.extend((a.subject, a.kind.value, a.amount) for a in attestations)

                relay._attest = record  # type: ignore[method-assign]
            path = artifact(tmp_path)
            relay_hashes: list[bytes] = []
            hashes, _ = pub.store.import_file(path, CHUNK)
            relay_hashes.extend(hashes)
            manifest = await pub.publish(Publication(path, "w"))
            plan = pub.machine.transfers[manifest.id].plan.trees[0]  # 2 peers: one tree
            middle = a if plan.parent.get(b.ctx.identity.peer_id) == a.ctx.identity.peer_id else b
            leaf = b if middle is a else a
            with trio.fail_after(WAIT_S):
                await leaf.wait_version("w")
            middle_id = middle.ctx.identity.peer_id
            assert leaf.status()["bad_chunks"] >= 1
            assert middle_id in leaf.driver.status()["penalties"]  # type: ignore[attr-defined]
            t = leaf.machine.transfers[manifest.id]
            assert t.failed[middle_id] is True  # dropped as a source for good
            assert (middle_id, "relay_bad_chunk", 5) in attested
            # the sources that did serve the leaf are credited once it is complete
            credited = {s: n for s, k, n in attested if k == "relay_served"}
            assert credited and sum(credited.values()) == len(hashes)
            assert middle_id not in credited or credited[middle_id] < len(hashes)
            out = tmp_path / "leaf.bin"
            ChunkStore(leaf.store.root).export(manifest, out)  # the leaf's own store, unpatched
            assert out.read_bytes() == path.read_bytes()

    trio.run(main)
