"""Policy dissemination: adapters travel from the learner to rollout workers by the weight relay.

* The learner publishes each version's exported llama.cpp LoRA GGUF through its daemon's relay
  as the artifact ``rl-adapter/<model>`` (:func:`adapter_name`) with the policy version as the
  manifest's version: a signed, content-addressed manifest, chunks pipelined down the relay
  plan to every connected peer (node/rl/network_learner.py calls ``POST /relay/publish``).
* A rollout worker whose generator can take adapters (``add_adapter(version, path, sha256)``)
  follows that artifact with an :class:`AdapterFollower`: when a version completes in its relay
  (chunks checked against the manifest), the file is exported next to the node's data, hashed,
  and handed to the generator, which loads it beside the base model and switches to it without
  reloading the base (models/rl/rollout.py). The generator keeps the last few versions, so jobs
  for a slightly older version still run, and bids only for the versions it holds.
* ``learner`` (a peer id), when set, is the only publisher whose adapters are taken. Without
  it, ``trusted`` decides: the worker passes the learners whose signed job announcements for
  its model it has seen (protocol/rl/worker.py), so a stranger publishing an artifact under
  the model's name is ignored. When a learner is first seen, :meth:`AdapterFollower.catch_up`
  takes the newest version of its that the relay already holds.

Publish-to-swap time: the learner notes the wall-clock time of its publish call, the follower
the wall-clock time the adapter became usable (``ready_at`` in the worker's status); on one
host, or hosts with synchronised clocks, their difference is the dissemination time.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from protocol.relay.manifest import Manifest

#: relay artifact names of policy adapters start with this, then the run's model name
ARTIFACT_PREFIX = "rl-adapter/"
#: swaps a follower remembers for its status
MAX_RECORDED = 64


def run_model_name(spec: str) -> str:
    """The model name a run and its workers agree on for a model spec: "default" for the
    embedded model, a .gguf file's stem (paths differ between machines), else the name."""
    if not spec:
        return "default"
    return Path(spec).stem if spec.endswith(".gguf") else spec


def adapter_name(model: str) -> str:
    """The relay artifact name under which a learner publishes adapters of ``model``."""
    if not model:
        raise ValueError("an adapter artifact needs the run's model name")
    return ARTIFACT_PREFIX + model


class AdapterHolder(Protocol):
    """A generator that takes adapters (node/rl/rollout_worker.py's ModelsGenerator)."""

    model: str

    def versions(self) -> Collection[int]: ...

    def add_adapter(self, version: int, path: Path, sha256: str) -> float:
        """Load the adapter (blocking) and switch to it; seconds spent."""
        ...


class RelayHooks(Protocol):
    """What the follower uses of the relay service (node/relay/service.py)."""

    def on_version_complete(self, callback: Callable[[Manifest], Awaitable[None] | None]) -> None:
        ...

    async def export(self, manifest: Manifest, out: Path) -> None: ...

    def latest(self, name: str, signer: str | None = None) -> Manifest | None: ...


@dataclass(frozen=True, slots=True)
class Swap:
    version: int
    manifest: str  # hex id of the relay manifest it came in
    export_s: float  # relay store -> adapter file
    load_s: float  # llama.cpp adapter load and switch on the live context
    ready_at: float  # wall-clock time (time.time()) the version became usable here


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class AdapterFollower:
    """Takes each completed adapter version of the generator's model into the generator."""

    def __init__(self, relay: RelayHooks, holder: AdapterHolder, directory: Path, *,
                 learner: str = "", trusted: Callable[[str], bool] | None = None,
                 log: Any = None) -> None:
        self.relay, self.holder, self.directory = relay, holder, Path(directory)
        self.name = adapter_name(holder.model)
        self.learner = learner
        #: without ``learner``: whether a publisher may be taken from (None: any publisher)
        self.trusted = trusted
        self.log = log
        self.swaps: list[Swap] = []
        self.failures = 0
        self.ignored = 0
        self._lock = trio.Lock()  # one adapter taken at a time, in the order they complete

    def install(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.relay.on_version_complete(self.on_version)

    def accepts(self, signer: str) -> bool:
        if self.learner:
            return signer == self.learner
        return self.trusted is None or self.trusted(signer)

    async def catch_up(self, signer: str = "") -> None:
        """Take the newest complete version (of ``signer``'s, else of the configured or any
        learner's) the relay already holds: kept across a restart (the relay restores its
        versions without completing them again) or completed before its learner was trusted."""
        signer = self.learner or signer
        if not signer and self.trusted is not None:
            return  # no learner seen yet: nothing to take
        manifest = self.relay.latest(self.name, signer or None)
        if manifest is not None:
            await self.on_version(manifest)

    async def on_version(self, manifest: Manifest) -> None:
        if manifest.name != self.name:
            return
        if not self.accepts(manifest.signer) or manifest.version < 1:
            self.ignored += 1
            return
        async with self._lock:
            if manifest.version in self.holder.versions():
                return
            try:
                await self._take(manifest)
            except Exception as exc:  # a bad file or a refused adapter: this version is skipped
                self.failures += 1
                if self.log is not None:
                    self.log.warning("rl.adapter_failed", version=manifest.version,
                                     error=f"{type(exc).__name__}: {exc}")

    async def _take(self, manifest: Manifest) -> None:
        t = time.perf_counter()
        path = self.directory / f"v{manifest.version}-{manifest.id.hex()[:16]}.gguf"
        tmp = path.with_suffix(".part")
        await self.relay.export(manifest, tmp)
        sha = await trio.to_thread.run_sync(file_sha256, tmp)
        await trio.to_thread.run_sync(os.replace, tmp, path)
        export_s = time.perf_counter() - t
        load_s = await trio.to_thread.run_sync(
            self.holder.add_adapter, manifest.version, path, sha)
        swap = Swap(manifest.version, manifest.id.hex(), round(export_s, 6), round(load_s, 6),
                    time.time())
        self.swaps = [*self.swaps[-(MAX_RECORDED - 1):], swap]
        if self.log is not None:
            self.log.info("rl.adapter_swapped", **asdict(swap))
        await trio.to_thread.run_sync(self._prune)

    def _prune(self) -> None:
        """Remove files of versions the generator no longer holds (it loaded them in memory)."""
        held = set(self.holder.versions())
        for path in self.directory.glob("v*.gguf"):
            version = path.name[1:].partition("-")[0]
            if version.isdigit() and int(version) not in held:
                path.unlink(missing_ok=True)

    def status(self) -> dict[str, Any]:
        return {"artifact": self.name, "learner": self.learner, "failures": self.failures,
                "ignored": self.ignored, "swaps": [asdict(s) for s in self.swaps[-8:]]}
