"""Models from peers: a served model seeded into the relay, pulled by name or weights hash,
checked against the weights hash the ledger names.

Contract
--------
* Seeding (``[relay] seed_models``: model specs): the node cuts each model file into
  ``MODEL_CHUNK_SIZE`` chunks in its store and signs a manifest of it named by its weights hash
  (``protocol.relay.manifest.model_artifact_name``), with no recipients: nobody is pushed the
  bytes, and the manifest is gossiped and given to whoever asks (``ManifestQuery``). Every
  holder of the file cuts it alike, so their manifests are twins (protocol/relay/twins.py).
* Pulling (``pull``): the model is a weights hash, or a name that the ledger's capability
  records resolve to one (one hash only: two files under one name is an error naming both).
  The peers whose records offer that hash are asked for their manifests; the relay machine
  fetches from all of them at once and checks every chunk against the manifest as it
  arrives (a bad chunk costs its sender and is fetched elsewhere). Chunks are stored as they
  arrive, so a node killed mid-pull resumes where it stopped when asked again.
* Checking (``check``): a complete model artifact is re-read and hashed whole; bytes that do
  not hash to the name's weights hash are rejected (``RejectVersion``: the signer and every
  holder of the same content are penalized, the version dropped) and the reason kept for
  status. Only a ``verified`` version is a model: the CLI exports nothing else.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import trio

from node.relay.chunk_store import ChunkStore
from protocol.relay.events import FetchVersion, PublishVersion, RejectVersion
from protocol.relay.manifest import (
    MODEL_CHUNK_SIZE,
    ArtifactFormat,
    Manifest,
    make_body,
    model_artifact_name,
    model_weights_hash,
    sign_manifest,
)
from protocol.relay.transfer import TransferState

HEX_HASH_LEN = 64
#: a pull asks the holders that have not answered again this often (one may still be
#: seeding, or have missed the query), this many times
REASK_S = 5.0
REASKS = 12


class ModelsOwner(Protocol):
    """What model pulls use of the relay service (node/relay/service.py passes itself)."""

    ctx: Any
    store: ChunkStore

    @property
    def machine(self) -> Any: ...

    async def submit(self, event: object) -> None: ...

    def spawn(self, fn: Any, *args: Any) -> None: ...


def file_weights_hash(path: Path) -> bytes:
    """BLAKE2b-256 of a file: models.registry.identity_hash's value, as bytes."""
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.digest()


def artifact_weights_hash(store: ChunkStore, manifest: Manifest) -> bytes:
    """BLAKE2b-256 of an artifact's bytes as the store holds them (each chunk re-verified)."""
    h = hashlib.blake2b(digest_size=32)
    for piece in store.iter_artifact(manifest):
        h.update(piece)
    return h.digest()


class ModelPulls:
    """Seeding, pulling and checking models over the relay (module docstring)."""

    def __init__(self, service: ModelsOwner) -> None:
        self.service = service
        #: Merkle roots of model contents whose whole-file hash matched their name
        self.verified: set[bytes] = set()
        #: model artifact name -> why its last complete version was rejected
        self.rejected: dict[str, str] = {}

    # ------------------------------------------------------------ seeding

    async def seed(self, spec: str) -> Manifest:
        """Offer the model ``spec`` names (registry name or .gguf path) to peers."""
        from models.registry import resolve

        info = await trio.to_thread.run_sync(resolve, spec)
        if info.fmt != "gguf":
            raise ValueError(f"only GGUF models are seeded, {spec!r} is {info.fmt}")
        weights = await trio.to_thread.run_sync(file_weights_hash, info.path)
        name = model_artifact_name(weights)
        me = self.service.ctx.identity.peer_id
        held = self.service.machine.latest_complete(name, me)
        if held is not None:
            self.verified.add(held.body.merkle_root)
            return held  # seeded before a restart
        store = self.service.store
        hashes, total = await trio.to_thread.run_sync(
            store.import_file, info.path, MODEL_CHUNK_SIZE
        )
        body = make_body(name=name, version=1, chunk_size=MODEL_CHUNK_SIZE, chunk_hashes=hashes,
                         total_size=total, format=ArtifactFormat.GGUF)
        manifest = sign_manifest(self.service.ctx.identity, body)
        await trio.to_thread.run_sync(store.save_manifest, manifest)
        self.verified.add(manifest.body.merkle_root)  # hashed from the file just now
        await self.service.submit(PublishVersion(manifest))
        self.service.ctx.log.info("relay.model_seeded", model=info.name, weights=name,
                                  chunks=manifest.chunks)
        return manifest

    # ------------------------------------------------------------ pulling

    def offers(self) -> list[tuple[str, str, bytes]]:
        """(peer, model name, weights hash) of every model offer in the live ledger."""
        ledger = self.service.ctx.services.get("ledger")
        if ledger is None:
            return []
        out = []
        for held in ledger.machine.view.state.live_records(ledger.now_ms()):
            for m in held.record.models:
                out.append((held.record.peer_id, m.name, m.weights_hash))
        return out

    def resolve(self, model: str) -> tuple[bytes, list[str]]:
        """The weights hash ``model`` names (a hash in hex, or a model name the ledger
        knows) and the peers other than us whose records offer it. ValueError if none."""
        offers = self.offers()
        if len(model) == HEX_HASH_LEN and all(c in "0123456789abcdef" for c in model.lower()):
            weights = bytes.fromhex(model)
        else:
            hashes = sorted({w for _, name, w in offers if name == model})
            if not hashes:
                raise ValueError(f"no peer in the ledger offers a model named {model!r}")
            if len(hashes) > 1:
                raise ValueError(f"the ledger names {len(hashes)} different files {model!r}: "
                                 + ", ".join(h.hex() for h in hashes) + "; pull one by hash")
            weights = hashes[0]
        me = self.service.ctx.identity.peer_id
        holders = sorted({p for p, _, w in offers if w == weights and p != me})
        return weights, holders

    async def pull(self, model: str, only: frozenset[int] | None = None) -> dict[str, Any]:
        """Start (or resume, or widen) fetching ``model`` from the peers that offer it."""
        weights, holders = self.resolve(model)
        name = model_artifact_name(weights)
        if not holders and self.service.machine.latest_complete(name) is None:
            raise ValueError(f"no peer in the ledger offers weights {name}")
        self.rejected.pop(name, None)
        await self.service.submit(FetchVersion(name, ask=tuple(holders), only=only))
        self.service.spawn(self._reask, name, holders, only)
        return {"name": name, "weights_hash": name, "holders": holders}

    async def _reask(self, name: str, holders: list[str], only: frozenset[int] | None) -> None:
        """Ask the holders no transfer of ``name`` counts yet again, until none is left or
        what was asked for is held (a timer: an answer that never comes has no event)."""
        for _ in range(REASKS):
            await trio.sleep(REASK_S)
            live = [t for t in self.service.machine.transfers.values()
                    if t.manifest.name == name and t.state is not TransferState.ABANDONED]
            if any(t.satisfied for t in live) or name in self.rejected:
                return
            known = {p for t in live for p in (t.manifest.signer, *t.holders)}
            missing = tuple(p for p in holders if p not in known)
            if not missing:
                return
            await self.service.submit(FetchVersion(name, ask=missing, only=only))

    # ------------------------------------------------------------ checking

    async def check(self, manifest: Manifest) -> None:
        """A version completed: if it is a model, hash it whole against its name."""
        expected = model_weights_hash(manifest)
        if expected is None or manifest.body.merkle_root in self.verified:
            return
        got = await trio.to_thread.run_sync(artifact_weights_hash, self.service.store, manifest)
        if got == expected:
            self.verified.add(manifest.body.merkle_root)
            self.service.ctx.log.info("relay.model_verified", weights=manifest.name)
            return
        reason = f"bytes hash to {got.hex()[:16]}, not the weights hash {manifest.name[:16]}"
        self.rejected[manifest.name] = f"{reason} (signed by {manifest.signer})"
        self.service.ctx.log.warning("relay.model_rejected", weights=manifest.name,
                                     signer=manifest.signer, got=got.hex())
        await self.service.submit(RejectVersion(manifest.id, reason))

    def is_verified(self, manifest: Manifest) -> bool | None:
        """Whether a model artifact's bytes matched its weights hash (None: not a model)."""
        if model_weights_hash(manifest) is None:
            return None
        return manifest.body.merkle_root in self.verified
