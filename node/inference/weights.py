"""A block server's weights from peers: only the bytes its stage reads.

Contract
--------
A node started with ``serve_blocks = "A:B"`` and ``[inference] model`` set to a weights hash
(64 hex digits) has no model file: :func:`fetch_stage` pulls the model's relay artifact
(node/relay/models.py) from the peers whose ledger records offer it, but only some chunks
(``FetchVersion.only``): first the file's start, more of it until the GGUF header parses,
then the chunks that hold the tensors of blocks [A, B). Every chunk is checked against the
manifest as it arrives (a bad one costs its sender and comes from another holder). The
chunks are written at their offsets into a sparse file of the model's full size
(``<data_dir>/models/<hash>.partial.gguf``): the loader (models/gguf_reader.py,
models/gguf_torch.py) reads the header and the stage's tensors only, so the holes are never
read. A stage holds no embedding and no output head (the requester's ``Head`` does), so
those tensors are not fetched. ``bytes_fetched`` is what came from peers for it.

The whole file cannot be checked against its weights hash without the whole file: the
chunks are checked against the manifest of a holder the ledger names, and a chain's
verification (layer-state checks) is what catches a stage computing with wrong weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from models.gguf_reader import HeaderIncomplete, tensor_spans
from protocol.relay.transfer import Transfer, TransferState

#: while no peer in the ledger offers the model yet, it is looked for again this often
OFFERS_POLL_S = 1.0


@dataclass(frozen=True)
class FetchedStage:
    path: Path
    n_blocks: int
    #: the model's name in the ledger's offers (the weights hash if none names it)
    model_name: str
    #: bytes received from peers for this stage (chunks already on disk are not counted)
    bytes_fetched: int
    total_size: int


def block_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    index = name.split(".", 2)[1]
    return int(index) if index.isdigit() else None


def chunks_of(spans: list[tuple[int, int]], chunk_size: int) -> set[int]:
    """The chunk indices that hold the byte ranges ``spans`` ((offset, length) pairs)."""
    out: set[int] = set()
    for offset, length in spans:
        if length > 0:
            out.update(range(offset // chunk_size, (offset + length - 1) // chunk_size + 1))
    return out


def _live(relay: Any, name: str) -> list[Transfer]:
    return [t for t in relay.machine.transfers.values()
            if t.manifest.name == name and t.state is not TransferState.ABANDONED]


async def wait_held(relay: Any, name: str, indices: set[int]) -> Transfer:
    """The transfer of artifact ``name`` once it holds every chunk of ``indices`` (bound the
    wait with a cancel scope)."""
    while True:
        stored = relay.chunk_stored
        for t in _live(relay, name):
            if all(0 <= i < len(t.have) and t.have[i] for i in indices):
                return t
        if name in relay.models.rejected:
            raise ValueError(f"model {name} rejected: {relay.models.rejected[name]}")
        await stored.wait()


async def _want(relay: Any, name: str, indices: set[int]) -> Transfer:
    await relay.models.pull(name, only=frozenset(indices))
    return await wait_held(relay, name, indices)


def _prefix(relay: Any, t: Transfer, chunks: int) -> bytes:
    return b"".join(relay.store.read_chunk(t.manifest.chunk_hashes[i]) for i in range(chunks))


def _write_sparse(relay: Any, t: Transfer, indices: set[int], out: Path) -> None:
    """The held ``indices`` of ``t`` at their offsets in a file of the artifact's full size."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        f.truncate(t.manifest.body.total_size)
        for i in sorted(indices):
            f.seek(t.manifest.chunk_span(i)[0])
            f.write(relay.store.read_chunk(t.manifest.chunk_hashes[i]))
    tmp.replace(out)


async def fetch_stage(relay: Any, weights_hex: str, start: int, end: int, out_dir: Path,
                      log: Any) -> FetchedStage:
    """Fetch the header and blocks [start, end) of the model with weights hash ``weights_hex``
    and write them into a sparse GGUF (module docstring). ValueError if the model's header
    does not parse or the range is outside it."""
    name = weights_hex.lower()
    while True:  # the ledger may not have any holder's offer yet
        try:
            t = await _want(relay, name, {0})
            break
        except ValueError as exc:
            if "offers" not in str(exc):
                raise
            log.info("inference.waiting_for_model_offers", weights=name)
            await trio.sleep(OFFERS_POLL_S)  # offers arrive by gossip: no event to wait on
    chunks, size = 1, t.manifest.body.chunk_size
    while True:
        prefix = await trio.to_thread.run_sync(_prefix, relay, t, chunks)
        try:
            meta, header, spans = tensor_spans(
                memoryview(prefix), lambda n: (b := block_of(n)) is not None and start <= b < end)
            break
        except HeaderIncomplete:
            if chunks >= t.manifest.chunks:
                raise ValueError(f"model {name}: the GGUF header runs past the file") from None
            chunks = min(2 * chunks, t.manifest.chunks)
            t = await _want(relay, name, set(range(chunks)))
    arch = meta.get("general.architecture")
    n_blocks = meta.get(f"{arch}.block_count")
    if not isinstance(n_blocks, int) or not 0 <= start < end <= n_blocks:
        raise ValueError(f"model {name}: blocks {start}:{end} are outside its {n_blocks} blocks")
    needed = chunks_of([(0, header), *spans], size)
    t = await _want(relay, name, needed)
    path = out_dir / f"{name}.partial.gguf"
    await trio.to_thread.run_sync(_write_sparse, relay, t, needed, path)
    named = [n for _, n, w in relay.models.offers() if w.hex() == name]
    fetched = sum(relay.fetched_bytes[x.manifest.id] for x in _live(relay, name))
    log.info("inference.stage_fetched", weights=name, start=start, end=end, chunks=len(needed),
             bytes_fetched=fetched, total=t.manifest.body.total_size)
    return FetchedStage(path, n_blocks, named[0] if named else name, fetched,
                        t.manifest.body.total_size)
