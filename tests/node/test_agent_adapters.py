"""node/agents/adapters.py: an agent's adapter is loaded from its file, or taken from the relay
only when the bytes hash to the name the card gives; everything else is a state, not a raise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from node.agents.adapters import (
    READY,
    AgentAdapters,
    adapter_artifact,
    adapter_file,
    adapter_hash,
)
from node.agents.config import AgentSpec


@dataclass(frozen=True)
class Version:  # the fields of a relay Manifest the loader reads
    name: str
    signer: str
    data: bytes


class Relay:
    """The relay hooks the loader uses, over versions held in memory."""

    def __init__(self) -> None:
        self.held: list[Version] = []
        self.callbacks: list[Any] = []

    def on_version_complete(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def latest(self, name: str, signer: str | None = None) -> Version | None:
        return next((v for v in reversed(self.held) if v.name == name), None)

    async def export(self, manifest: Version, out: Path) -> None:
        out.write_bytes(manifest.data)

    async def complete(self, version: Version) -> None:
        self.held.append(version)
        for callback in self.callbacks:
            await callback(version)


class Solver:
    def __init__(self, refuse: bytes = b"") -> None:
        self.refuse = refuse
        self.loaded: dict[str, bytes] = {}

    def add_adapter(self, key: str, path: Path) -> None:
        data = path.read_bytes()
        if data == self.refuse:
            raise ValueError("llama.cpp refused the LoRA adapter")
        self.loaded[key] = data


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def info(self, event: str, **_: Any) -> None:
        self.events.append(event)

    warning = info


def _agent(name: str, adapter: str | None) -> AgentSpec:
    return AgentSpec(name=name, description="d", adapter=adapter)


def _loader(solver: Any, relay: Any, tmp_path: Path) -> tuple[AgentAdapters, list[int]]:
    changes: list[int] = []

    async def changed() -> None:
        changes.append(1)

    return AgentAdapters(solver, relay, tmp_path / "adapters", Log(), changed), changes


def test_a_hashed_adapter_is_taken_only_when_its_bytes_hash_to_its_name(tmp_path: Path) -> None:
    good = b"the adapter"
    key = adapter_hash(good)
    relay, solver = Relay(), Solver(refuse=b"junk")
    loader, changes = _loader(solver, relay, tmp_path)

    async def main() -> None:
        await loader.start([_agent("arith", key), _agent("plain", None),
                            _agent("named", "calc-lora"), _agent("junk", adapter_hash(b"junk"))])
        assert loader.states["arith"].startswith("waiting for adapter")
        assert "neither a file nor a content hash" in loader.states["named"]
        assert "plain" not in loader.states and not changes
        await relay.complete(Version(adapter_artifact(key), "mallory", b"forged"))
        assert "refused" in loader.states["arith"] and "mallory" in loader.states["arith"]
        assert not solver.loaded and not changes
        await relay.complete(Version(adapter_artifact(key), "learner", good))
        await relay.complete(Version(adapter_artifact(adapter_hash(b"junk")), "x", b"junk"))

    trio.run(main)
    assert loader.states["arith"] == READY and loader.loaded == {"arith": key}
    assert solver.loaded == {key: good} and changes == [1]
    assert loader.states["junk"].startswith("failed: ValueError: llama.cpp refused")
    assert (tmp_path / "adapters" / f"{key}.gguf").read_bytes() == good
    assert not list((tmp_path / "adapters").glob("*.part"))


def test_an_adapter_the_relay_already_holds_and_a_file_adapter_load_at_start(
        tmp_path: Path) -> None:
    held, on_disk = b"held", tmp_path / "lora.gguf"
    on_disk.write_bytes(b"file")
    relay, solver = Relay(), Solver()
    relay.held.append(Version(adapter_hash(held), "learner", held))
    loader, changes = _loader(solver, relay, tmp_path)
    trio.run(loader.start, [_agent("a", adapter_hash(held)), _agent("b", str(on_disk))])
    assert loader.loaded == {"a": adapter_hash(held), "b": adapter_hash(b"file")}
    assert len(changes) == 2


@pytest.mark.parametrize("solver, relay, detail", [
    (object(), Relay(), "cannot apply LoRA adapters"),
    (Solver(), None, "no relay service"),
])
def test_an_agent_whose_adapter_cannot_be_had_says_why(
        solver: Any, relay: Any, detail: str, tmp_path: Path) -> None:
    loader, _ = _loader(solver, relay, tmp_path)
    trio.run(loader.start, [_agent("a", adapter_hash(b"x"))])
    assert loader.states["a"].startswith("failed") and detail in loader.states["a"]
    assert not loader.loaded


def test_an_artifact_name_is_a_content_hash() -> None:
    with pytest.raises(ValueError, match="64 hex"):
        adapter_artifact("calc-lora")


class FetchingRelay(Relay):
    """A relay that brings a version asked for by ``fetch`` (``bring``), or nothing."""

    def __init__(self, bring: Version | None = None) -> None:
        super().__init__()
        self.bring, self.fetched = bring, []
        self.arrived = trio.Event()

    async def fetch(self, name: str, signer: str | None = None) -> None:
        self.fetched.append(name)
        if self.bring is not None:
            self.held.append(self.bring)
            self.arrived.set()

    async def wait_version(self, name: str) -> Version:
        await self.arrived.wait()
        return self.held[-1]


def test_a_verifier_gets_an_adapter_file_only_with_the_bytes_its_hash_names(
        tmp_path: Path) -> None:
    """``adapter_file`` (the verifier's fetch): the relay's version when its bytes hash to the
    name, fetched when the relay does not hold it yet, then kept; None when nobody brings it
    within the wait, when only wrong bytes come, or with no relay."""
    data = b"an adapter"
    key = adapter_hash(data)

    async def main() -> None:
        assert await adapter_file(None, tmp_path / "a", key, 1.0) is None
        wrong = FetchingRelay(Version(key, "hostile", b"other bytes"))
        assert await adapter_file(wrong, tmp_path / "a", key, 1.0) is None
        assert wrong.fetched == [key] and not list((tmp_path / "a").iterdir())
        nobody = FetchingRelay()
        assert await adapter_file(nobody, tmp_path / "a", key, 5.0) is None  # waited 5 s
        relay = FetchingRelay(Version(key, "learner", data))
        path = await adapter_file(relay, tmp_path / "a", key, 1.0)
        assert path is not None and path.read_bytes() == data and relay.fetched == [key]
        held = Relay()  # the file is kept: the next check reads it without the relay
        assert await adapter_file(held, tmp_path / "a", key, 1.0) == path

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
