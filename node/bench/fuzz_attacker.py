"""The fuzz attacker: a real libp2p peer in its own process, attacking one protocol of a daemon.

``python -m node.bench.fuzz_attacker`` reads one JSON line on stdin (the daemon's address,
peer id, API URL and network id, the target protocol, the attack kinds, frames per kind, a
seed and time limits), attacks, and prints one JSON line: per kind, the frames it wrote, the
identities it used, and for each identity the daemon banned, how many frames that identity
had written when its connection was dropped and /status listed the ban.

How it attacks: one identity (a fresh Ed25519 key drawn from the seed) dials the daemon and
runs ``WORKERS`` stream writers side by side; each opens a stream on the target protocol,
writes ``frames_per_stream`` frames of the kind (node/bench/fuzz_frames.py) and closes it, or
for ``stall`` writes half a frame and holds the stream until the daemon ends it or
``stall_hold_s`` passes. When the daemon drops the connection the attacker asks /status
whether it is banned: then it counts the ban and goes on with a new identity (as a real
attacker with many keys would), else it redials with the same identity.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
import trio

from crypto.keys import Identity
from node.bench.fuzz_frames import MAKERS, Target, targets
from node.p2p.host import open_p2p
from node.transport import TransportError

WORKERS = 8
CONNECT_TIMEOUT_S = 10.0
#: a target that refuses this many fresh identities in a row is given up (the daemon is down)
MAX_REFUSED = 3
#: a protocol the daemon refuses this many times (multistream "na"), none written, is not served
UNSUPPORTED_AFTER = 3
#: how py-libp2p's multistream-select failure reads when the far side answers "na"
_NOT_SUPPORTED = "not supported"


@dataclass
class KindResult:
    frames: int = 0
    identities: int = 0
    #: per banned identity: the frames it had written when the daemon dropped it
    banned_after: list[int] = field(default_factory=list)
    refused: int = 0
    #: why the first refused dial failed ("" when none was)
    refusal: str = ""
    unsupported: bool = False


@dataclass
class _Run:
    """One identity's attack: frames written, and whether the daemon dropped it."""

    frames: int = 0
    dropped: bool = False
    #: streams the daemon refused to negotiate (it does not serve the protocol)
    open_failures: int = 0

    @property
    def unsupported(self) -> bool:
        """The daemon refuses every stream on the protocol: it does not serve it."""
        return self.frames == 0 and self.open_failures >= UNSUPPORTED_AFTER


def _refused_protocol(exc: BaseException) -> bool:
    """Whether a failed open was the far side answering "na" (somewhere in the cause chain)."""
    cause: BaseException | None = exc
    while cause is not None:
        if _NOT_SUPPORTED in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


async def _is_banned(api_url: str, peer: str) -> bool:
    def ask() -> bool:
        try:
            status = httpx.get(api_url + "/status", timeout=10.0).json()
        except (httpx.HTTPError, ValueError):
            return False
        return peer in status.get("banned", {})

    return await trio.to_thread.run_sync(ask)


async def _writer(transport: Any, daemon: str, target: Target, kind: str, rng: random.Random,
                  run: _Run, left: list[int], stall_hold_s: float) -> None:
    make = MAKERS[kind]
    while left[0] > 0 and not run.dropped and not run.unsupported:
        try:
            stream = await transport.open_stream(daemon, target.protocol_id)
        except TransportError as exc:
            if _refused_protocol(exc):
                run.open_failures += 1
            else:  # no usable connection left: dropped, whatever the peer list says yet
                run.dropped = True
            await trio.sleep(0)
            continue
        try:
            # a frame counts once its writing starts: the daemon may cut it off midway
            # (an oversized one, as it should), and it was sent all the same
            if kind == "stall":
                run.frames += 1
                left[0] -= 1
                await stream.write(make(target, rng))
                with trio.move_on_after(stall_hold_s):
                    await stream.read(1 << 16)
            else:
                for _ in range(target.frames_per_stream):
                    if left[0] <= 0:
                        break
                    run.frames += 1
                    left[0] -= 1
                    await stream.write(make(target, rng))
        except TransportError:
            pass
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await stream.reset()
                except TransportError:
                    pass
        if daemon not in transport.connected_peers():
            run.dropped = True


async def _one_identity(config: dict[str, Any], target: Target, kind: str, seed: bytes,
                        rng: random.Random, left: list[int], result: KindResult,
                        deadline: float) -> str:
    """Attack with one identity until it is banned, the budget or the time is spent;
    returns "banned", "done", "refused" or "unsupported"."""
    daemon, addr = config["daemon_peer"], config["daemon_addr"]
    async with open_p2p(seed) as transport:
        run = _Run()
        while left[0] > 0 and trio.current_time() < deadline:
            with trio.move_on_after(CONNECT_TIMEOUT_S):
                try:
                    await transport.connect(addr)
                except TransportError as exc:
                    if await _is_banned(config["api_url"], transport.peer_id):
                        break
                    result.refusal = result.refusal or str(exc)[:300]
                    return "refused"
            run.dropped = False
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as nursery:
                    for _ in range(WORKERS):
                        nursery.start_soon(_writer, transport, daemon, target, kind,
                                           random.Random(rng.random()), run, left,
                                           config["stall_hold_s"])
            if run.unsupported:
                return "unsupported"
            if run.dropped and await _is_banned(config["api_url"], transport.peer_id):
                result.frames += run.frames
                result.banned_after.append(run.frames)
                return "banned"
        result.frames += run.frames
        return "done"


async def attack(config: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(config["seed"])
    attacker = Identity.from_seed(rng.randbytes(32))
    now_ms = int(time.time() * 1000)
    by_name = {t.name: t for t in targets(config["network_id"], attacker, config["daemon_peer"],
                                          now_ms)}
    target = by_name[config["target"]]
    out: dict[str, Any] = {}
    for kind in config["kinds"]:
        result = KindResult()
        left = [int(config["frames_per_kind"])]
        deadline = trio.current_time() + float(config["kind_time_s"])
        refused_in_row = 0
        while left[0] > 0 and trio.current_time() < deadline and refused_in_row < MAX_REFUSED:
            result.identities += 1
            how = await _one_identity(config, target, kind, rng.randbytes(32), rng, left,
                                      result, deadline)
            if how == "unsupported":
                result.unsupported = True
                break
            refused_in_row = refused_in_row + 1 if how == "refused" else 0
            result.refused += how == "refused"
        out[kind] = result.__dict__
        if result.unsupported:
            break
    return out


def main() -> None:
    # stdout carries the one JSON result line; logs go to stderr, errors only.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
    )
    config = json.loads(sys.stdin.readline())
    print(json.dumps(trio.run(attack, config)), flush=True)


if __name__ == "__main__":
    main()
