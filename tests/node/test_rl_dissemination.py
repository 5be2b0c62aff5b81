"""The rollout worker's side of policy dissemination, without a network: an adapter version
that completes in the relay is exported, hashed and handed to the generator; other artifacts,
other publishers, the base version and versions already held are left alone; a refused adapter
is counted, not fatal; files of versions the generator dropped are removed."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import pytest
import trio

from crypto.keys import Identity
from node.rl.dissemination import AdapterFollower, adapter_name, run_model_name
from protocol.relay.manifest import ArtifactFormat, Manifest, make_body, sign_manifest

LEARNER = Identity.from_seed(b"learner".ljust(32, b"\0"))
OTHER = Identity.from_seed(b"other".ljust(32, b"\0"))


def _manifest(name: str, version: int, signer: Identity = LEARNER) -> Manifest:
    content = f"{name}:{version}".encode()
    body = make_body(name=name, version=version, chunk_size=4096,
                     chunk_hashes=[hashlib.sha256(content).digest()], total_size=len(content),
                     format=ArtifactFormat.GGUF)
    return sign_manifest(signer, body)


class FakeRelay:
    """The relay's hooks: callbacks registered, a version's bytes written on export."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Manifest], Awaitable[None] | None]] = []
        self.held: list[Manifest] = []

    def on_version_complete(self, callback: Callable[[Manifest], Awaitable[None] | None]) -> None:
        self.callbacks.append(callback)

    async def export(self, manifest: Manifest, out: Path) -> None:
        out.write_bytes(f"{manifest.name}:{manifest.version}".encode())

    def latest(self, name: str, signer: str | None = None) -> Manifest | None:
        mine = [m for m in self.held if m.name == name and signer in (None, m.signer)]
        return max(mine, key=lambda m: m.version, default=None)

    async def complete(self, manifest: Manifest) -> None:
        self.held.append(manifest)
        for callback in self.callbacks:
            result = callback(manifest)
            if result is not None:
                await result


class Holder:
    """A generator keeping the last two adapter versions (and the base)."""

    model = "tiny"

    def __init__(self) -> None:
        self.loaded: dict[int, tuple[bytes, str]] = {}

    def versions(self) -> Collection[int]:
        return [0, *self.loaded]

    def add_adapter(self, version: int, path: Path, sha256: str) -> float:
        data = path.read_bytes()
        if data.endswith(b":13"):
            raise ValueError("llama.cpp refused the adapter")
        self.loaded[version] = (data, sha256)
        while len(self.loaded) > 2:
            self.loaded.pop(min(self.loaded))
        return 0.001


def test_relayed_versions_reach_the_generator(tmp_path: Path) -> None:
    relay, holder = FakeRelay(), Holder()
    follower = AdapterFollower(relay, holder, tmp_path / "adapters", learner=LEARNER.peer_id)
    follower.install()
    name = adapter_name("tiny")

    async def main() -> None:
        await relay.complete(_manifest(name, 1))
        await relay.complete(_manifest("rl-adapter/other-model", 2))  # not our model
        await relay.complete(_manifest(name, 3, signer=OTHER))  # not our learner
        await relay.complete(_manifest(name, 1))  # held already
        await relay.complete(_manifest(name, 13))  # refused by llama.cpp
        await relay.complete(_manifest(name, 2))
        await relay.complete(_manifest(name, 4))

    trio.run(main)
    assert sorted(holder.loaded) == [2, 4]
    data, sha = holder.loaded[4]
    assert data == f"{name}:4".encode() and sha == hashlib.sha256(data).hexdigest()
    assert [s.version for s in follower.swaps] == [1, 2, 4]
    assert all(s.ready_at > 0 and s.load_s == 0.001 for s in follower.swaps)
    assert (follower.failures, follower.ignored) == (1, 1)
    files = sorted(p.name.partition("-")[0] for p in (tmp_path / "adapters").iterdir())
    assert files == ["v2", "v4"]  # version 1 was dropped by the generator, 13 never taken
    assert follower.status()["artifact"] == name

    # a restarted worker: the relay restored its last two versions without completing them
    relay.held = [m for m in relay.held if m.name == name and m.version in (2, 4)]
    again = Holder()
    restarted = AdapterFollower(relay, again, tmp_path / "adapters", learner=LEARNER.peer_id)
    trio.run(restarted.catch_up)
    assert sorted(again.loaded) == [4]


def test_model_names_for_runs() -> None:
    assert run_model_name("") == "default"
    assert run_model_name("/some/where/tiny.gguf") == "tiny"
    assert run_model_name("smollm2-135m-instruct-q4_1") == "smollm2-135m-instruct-q4_1"
    assert adapter_name("tiny") == "rl-adapter/tiny"
    with pytest.raises(ValueError, match="model name"):
        adapter_name("")


def test_without_a_learner_only_learners_seen_are_followed(tmp_path: Path) -> None:
    """No ``learner`` configured: an adapter is taken only from a learner whose job
    announcements the worker saw; a version relayed before that is caught up with then."""
    relay, holder = FakeRelay(), Holder()
    seen: set[str] = set()
    follower = AdapterFollower(relay, holder, tmp_path / "adapters", trusted=seen.__contains__)
    follower.install()
    name = adapter_name("tiny")

    async def main() -> None:
        await relay.complete(_manifest(name, 1))  # its beacons not seen yet
        await relay.complete(_manifest(name, 5, signer=OTHER))  # a stranger
        await follower.catch_up()  # nobody seen: nothing taken
        assert holder.loaded == {} and follower.ignored == 2
        seen.add(LEARNER.peer_id)
        await follower.catch_up(LEARNER.peer_id)  # the worker saw its first beacon
        assert sorted(holder.loaded) == [1]
        await relay.complete(_manifest(name, 2))
        await relay.complete(_manifest(name, 6, signer=OTHER))

    trio.run(main)
    assert sorted(holder.loaded) == [1, 2]
    assert follower.ignored == 3
