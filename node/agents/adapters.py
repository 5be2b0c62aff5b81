"""LoRA adapters of the agents this node hosts: named by content hash, fetched by the relay.

* An adapter's **content hash** (:func:`adapter_hash`: BLAKE2b-256 of the file's bytes,
  personalised ``symphony-adapter``) is what an agent card's ``adapter`` field says of it.
  ``symphony rl publish FILE`` relays the file as the artifact named by that hash in hex
  (:func:`adapter_artifact`, a raw artifact: the relay's own check of GGUF artifacts named by
  a hash is for models), and prints the hash to put in an ``[[agents]]`` table.
* :class:`AgentAdapters` gets every hosted agent's adapter into the solver: a file path is
  read and loaded at once; a hash (64 hex digits) is waited for in the relay, from any
  publisher (the relay may hold it already, or a version of that name completes later). The
  bytes that arrive are trusted only when they hash to the name: a publisher who puts other
  bytes under a hash is refused (``adapter.refused``) and a later, right version is still
  taken. The solver's ``add_adapter(key, path)`` loads the file (llama.cpp refusing it is an
  error named in the agent's state). Until its adapter is loaded an agent does not bid;
  :attr:`states` says for each why (node/market/executor.py shows it in its status).
* :func:`adapter_file` is the verifier's way to the same bytes: a result on an adapter names
  its hash, and a check merges that adapter into the model it re-runs
  (node/verification/service.py). It takes the file this node already holds under the hash,
  or asks the relay for the artifact and waits a bounded time; bytes that do not hash to the
  name are never used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from crypto.hashing import digest
from node.agents.config import AgentSpec
from protocol.relay.manifest import Manifest

_ADAPTER_PERSON = b"symphony-adapter"
#: an adapter named by its content hash: 64 hex digits
HASH_PATTERN = re.compile(r"[0-9a-f]{64}")
READY = "ready"
#: where adapters fetched by the relay are kept, under the data dir (agents' and checks')
ADAPTERS_DIR = "agent-adapters"


def adapter_hash(data: bytes) -> str:
    """The content hash of an adapter file's bytes, in hex (what cards and artifacts name)."""
    return digest(data, person=_ADAPTER_PERSON).hex()


def file_adapter_hash(path: Path) -> str:
    """:func:`adapter_hash` of the file at ``path`` (blocking: reads it)."""
    return adapter_hash(Path(path).read_bytes())


def adapter_artifact(content_hash: str) -> str:
    """The relay artifact name under which the adapter of ``content_hash`` travels."""
    if HASH_PATTERN.fullmatch(content_hash) is None:
        raise ValueError(f"{content_hash!r} is not an adapter content hash (64 hex digits)")
    return content_hash


async def adapter_file(relay: Any, directory: Path, content_hash: str,
                       wait_s: float) -> Path | None:
    """The adapter file of ``content_hash`` under ``directory`` (kept there for later checks):
    already there, or fetched by ``relay`` within ``wait_s``; None when it cannot be had (no
    relay, nobody relays it in time, or only wrong bytes under its name)."""
    path = Path(directory) / f"{adapter_artifact(content_hash)}.gguf"
    if await trio.to_thread.run_sync(_holds, path, content_hash):
        return path
    if relay is None:
        return None
    manifest = relay.latest(content_hash)
    with trio.move_on_after(wait_s):
        if manifest is None:
            await relay.fetch(content_hash)
            manifest = await relay.wait_version(content_hash)
    if manifest is None:
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    try:
        await relay.export(manifest, tmp)
        if await trio.to_thread.run_sync(_holds, tmp, content_hash):
            await trio.to_thread.run_sync(os.replace, tmp, path)
            return path
    except Exception:  # a store error: as if nobody relayed it
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return None


def _holds(path: Path, content_hash: str) -> bool:
    try:
        return file_adapter_hash(path) == content_hash
    except OSError:
        return False


class AgentAdapters:
    """Loads the adapters of ``agents`` into ``solver`` (``add_adapter(key, path)``), from
    files or the ``relay`` (node/relay/service.py: ``latest``, ``export``,
    ``on_version_complete``; None: hashes cannot be fetched), calling ``changed()`` whenever
    an agent's adapter became ready."""

    def __init__(self, solver: Any, relay: Any, directory: Path, log: Any,
                 changed: Callable[[], Awaitable[None]]) -> None:
        self.solver, self.relay, self.directory, self.log = solver, relay, Path(directory), log
        self.changed = changed
        #: agent -> its adapter's key once loaded (the content hash)
        self.loaded: dict[str, str] = {}
        #: agent -> "ready", or why it does not bid yet / at all
        self.states: dict[str, str] = {}
        self._wanted: dict[str, list[str]] = {}  # content hash -> agents waiting for it
        self._lock = trio.Lock()  # one adapter taken at a time

    async def start(self, agents: Sequence[AgentSpec]) -> None:
        """Load the file adapters and look for the hashed ones (blocking work in threads)."""
        with_adapter = [a for a in agents if a.adapter is not None]
        if not with_adapter:
            return
        if not callable(getattr(self.solver, "add_adapter", None)):
            for a in with_adapter:
                self.states[a.name] = "failed: this node's solver cannot apply LoRA adapters"
            return
        for agent in with_adapter:
            await self._start_one(agent)
        if self._wanted and self.relay is not None:
            self.relay.on_version_complete(self.on_version)
            for key in list(self._wanted):
                manifest = self.relay.latest(adapter_artifact(key))
                if manifest is not None:
                    await self.on_version(manifest)

    async def _start_one(self, agent: AgentSpec) -> None:
        assert agent.adapter is not None
        path = agent.adapter_path
        if path is not None:
            try:
                key = await trio.to_thread.run_sync(file_adapter_hash, path)
            except OSError as exc:  # the file went away since the config was read
                self.states[agent.name] = f"failed: cannot read adapter {path}: {exc}"
                return
            await self._load(key, path, [agent.name])
        elif HASH_PATTERN.fullmatch(agent.adapter) is None:
            self.states[agent.name] = (f"failed: adapter {agent.adapter!r} is neither a file nor "
                                       "a content hash (symphony rl publish prints one)")
        elif self.relay is None:
            self.states[agent.name] = "failed: no relay service to fetch the adapter by"
        else:
            self._wanted.setdefault(agent.adapter, []).append(agent.name)
            self.states[agent.name] = f"waiting for adapter {agent.adapter[:16]} in the relay"

    async def on_version(self, manifest: Manifest) -> None:
        """A relay version completed: take it when it is a wanted adapter and its bytes hash
        to its name; anything else is refused and logged, never raised."""
        agents = self._wanted.get(manifest.name)
        if not agents:
            return
        async with self._lock:
            if manifest.name not in self._wanted:
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{manifest.name}.gguf"
            tmp = path.with_suffix(".part")
            try:
                await self.relay.export(manifest, tmp)
                got = await trio.to_thread.run_sync(file_adapter_hash, tmp)
            except Exception as exc:  # a store error: this version is skipped
                got, detail = "", f"{type(exc).__name__}: {exc}"
            else:
                detail = f"its bytes hash to {got[:16]}"
            if got != manifest.name:
                tmp.unlink(missing_ok=True)
                self.log.warning("adapter.refused", adapter=manifest.name,
                                 signer=manifest.signer, detail=detail)
                for name in agents:
                    self.states[name] = (f"waiting for adapter {manifest.name[:16]}: a version "
                                         f"from {manifest.signer} was refused ({detail})")
                return
            await trio.to_thread.run_sync(os.replace, tmp, path)
            del self._wanted[manifest.name]
            await self._load(manifest.name, path, agents)

    async def _load(self, key: str, path: Path, agents: Sequence[str]) -> None:
        try:
            await trio.to_thread.run_sync(self.solver.add_adapter, key, path)
        except Exception as exc:  # llama.cpp refused it: these agents never bid
            for name in agents:
                self.states[name] = f"failed: {type(exc).__name__}: {exc}"
            self.log.warning("adapter.failed", adapter=key, agents=list(agents),
                             error=f"{type(exc).__name__}: {exc}")
            return
        for name in agents:
            self.loaded[name] = key
            self.states[name] = READY
        self.log.info("adapter.loaded", adapter=key, agents=list(agents))
        await self.changed()
