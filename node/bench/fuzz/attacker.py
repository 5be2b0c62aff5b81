"""The fuzz attacker: a real libp2p peer in its own process, attacking one protocol of a daemon.

``python -m node.bench.fuzz.attacker`` reads one JSON line on stdin and prints one JSON line.
Two requests:

* ``{"discover": true, ...}``: dial the daemon, ask its identify (``/ipfs/id/1.0.0``) which
  protocols it serves, and print ``{"protocols": [...]}``: the bench attacks what the daemon
  says it serves, as an attacker would, so a protocol added to the daemon is attacked too;
* otherwise an attack on ``protocol_id``: for each attack kind in turn, frames are written
  until its share of ``frames_total`` is sent (:func:`kind_share`: an even share of what
  the kinds before it left) or ``kind_time_s`` has passed; printed per kind: the frames
  written, the identities used, for each identity the daemon banned how many frames it had
  written when the ban was seen, and identities refused at the dial.

How it attacks: ``identities`` identities at once, each a fresh Ed25519 key started,
connected and greeted as an ordinary peer (node/bench/fuzz/identities.py), each
running stream writers side by side (``Target.streams_at_once``; ``stall`` opens
``STALL_STREAMS``). A stream carries ``frames_per_stream`` frames of the kind
(node/bench/fuzz/frames.py): where the daemon reads one request per stream, one frame, then
the write side is closed and the answer (or the daemon's reset) awaited before the next
stream; where it keeps reading (ping, gossip, identify push, relay chunks), many. The first
``PROBES`` identities of a kind are probes: on a long-lived stream they wait for each ping's
echo, or ``SETTLE_S`` for the daemon's reset after each frame, so the ban is seen within a
stream or two of the frame that caused it (their counts are ``banned_after``); the others
write a stream's frames in one go, for volume, until the daemon resets the stream.
``bad_length`` and ``stall`` write one frame per stream (a frame cut short, then the
stream's end; half a frame, then nothing until the daemon ends the stream or
``stall_hold_s`` passes). An identity attacks until the daemon drops its connection or
``/status`` lists its ban (one poll for the whole process); then a fresh one takes over and
whether the last was banned is settled meanwhile. Frames written
after the ban and before the drop reached the attacker count as sent (the daemon refused
them by closing the connection). Printed per kind as well: ``elapsed_s`` and
``frames_per_s``.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from crypto.keys import Identity
from node.bench.fuzz.frames import MAKERS, Target, target_for
from node.bench.fuzz.identities import (
    CONNECT_TIMEOUT_S,
    BanWatch,
    Ready,
    discover,
    fresh_identity,
    greet,
)
from node.transport import TransportError

#: stall streams one identity holds open at once (the daemon caps a peer's streams per
#: protocol at 16 by default: beyond it each stream costs a flood fault)
STALL_STREAMS = 12
#: on a long-lived stream, how long a probe watches for the daemon's reset after each frame
#: before writing the next (so frames are not written blind into a stream already reset)
SETTLE_S = 0.02
#: after a stream the daemon refused while it was being negotiated, the writer waits this long
OPEN_RETRY_S = 0.05
#: identities per kind that attack as probes (each frame once the last one is answered), so
#: ``banned_after`` is exact to a stream or two; the others write frames back to back
PROBES = 3
#: a volume identity writes a stream's frames in writes of at most this many bytes
BATCH_BYTES = 64 << 10
#: how long a writer waits for the daemon's answer to a one-frame stream
ANSWER_TIMEOUT_S = 15.0
#: how long a writer waits for the daemon to end a long-lived stream it has closed
END_TIMEOUT_S = 1.0
#: a target that refuses this many fresh identities in a row is given up: a daemon that is
#: down refuses every one, a slow one only now and then
MAX_REFUSED = 20
#: a protocol the daemon refuses this many times (multistream "na"), none written, is not served
UNSUPPORTED_AFTER = 3
#: how py-libp2p's multistream-select failure reads when the far side answers "na"
_NOT_SUPPORTED = "not supported"
#: kinds written once per stream, which then ends (or, for a stall, hangs)
ONE_PER_STREAM = ("bad_length", "stall")


@dataclass
class KindResult:
    frames: int = 0
    identities: int = 0
    #: per banned probe identity: the frames it had written when the ban was seen
    banned_after: list[int] = field(default_factory=list)
    #: identities banned, probes and the others
    bans: int = 0
    refused: int = 0
    #: why the first refused dial failed ("" when none was)
    refusal: str = ""
    unsupported: bool = False
    #: seconds from the kind's start to its first ban (-1: none)
    first_ban_s: float = -1.0
    #: how long the kind ran, and its frames per second over that time
    elapsed_s: float = 0.0
    frames_per_s: float = 0.0


@dataclass
class _Run:
    """One identity's attack: frames written, and whether the daemon dropped it."""

    frames: int = 0
    dropped: bool = False
    #: when the drop (or the ban) was seen, in trio's clock
    ended_at: float = 0.0
    #: streams the daemon refused to negotiate (it does not serve the protocol)
    open_failures: int = 0
    #: a probe writes each frame only once the daemon has reacted to the last (its ban is
    #: counted in ``banned_after``); the others write back to back, for volume
    probe: bool = True

    @property
    def unsupported(self) -> bool:
        """The daemon refuses every stream on the protocol: it does not serve it."""
        return self.frames == 0 and self.open_failures >= UNSUPPORTED_AFTER

    def drop(self) -> None:
        if not self.dropped:
            self.dropped, self.ended_at = True, trio.current_time()


@dataclass
class _Kind:
    """What the identities attacking with one kind share: the budget, the clock, the tally."""

    name: str
    target: Target
    left: int
    deadline: float
    started: float
    result: KindResult = field(default_factory=KindResult)
    refused_in_row: int = 0
    #: identities still to run as probes (see _Run.probe)
    probes: int = PROBES

    @property
    def going(self) -> bool:
        return (self.left > 0 and trio.current_time() < self.deadline
                and self.refused_in_row < MAX_REFUSED and not self.result.unsupported)

    def take(self, run: _Run, wanted: int = 1) -> int:
        """Count up to ``wanted`` frames about to be written; how many the budget allows."""
        granted = min(wanted, max(0, self.left))
        self.left -= granted
        run.frames += granted
        return granted


def _refused_protocol(exc: BaseException) -> bool:
    """Whether a failed open was the far side answering "na" (somewhere in the cause chain)."""
    cause: BaseException | None = exc
    while cause is not None:
        if _NOT_SUPPORTED in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


async def _drain(stream: Any, timeout_s: float, *, answer: bool = False) -> None:
    """Read until the daemon ends the stream (EOF or reset) or ``timeout_s`` passes; with
    ``answer``, only until its first bytes (a relay keeps a reservation's stream open)."""
    with trio.move_on_after(timeout_s):
        while await stream.read(1 << 16):
            if answer:
                return


async def _one_stream(stream: Any, kind: _Kind, run: _Run, rng: random.Random,
                      stall_hold_s: float) -> None:
    """Write one stream's frames of ``kind`` (see the module doc)."""
    target, make = kind.target, MAKERS[kind.name]
    if kind.name in ONE_PER_STREAM or target.frames_per_stream == 1:
        if not kind.take(run):
            return
        await stream.write(make(target, rng))
        if kind.name == "stall":
            await _drain(stream, stall_hold_s)
            return
        await stream.close()  # our end of the stream: the daemon reads one request
        await _drain(stream, ANSWER_TIMEOUT_S, answer=True)
        return
    if run.probe:
        await _paced(stream, kind, run, rng)
    else:
        await _batched(stream, kind, run, rng)
    await stream.close()
    await _drain(stream, END_TIMEOUT_S)  # a long-lived protocol may keep its side open


async def _paced(stream: Any, kind: _Kind, run: _Run, rng: random.Random) -> None:
    """A probe's frames: each once the daemon has had the time to react to the last."""
    target, make = kind.target, MAKERS[kind.name]
    for _ in range(target.frames_per_stream):
        if not kind.take(run):
            return
        frame = make(target, rng)
        await stream.write(frame)
        if target.framing == "raw":  # a ping's echo paces the next one
            with trio.move_on_after(ANSWER_TIMEOUT_S):
                await stream.read(len(frame))
        else:  # the daemon answers nothing here: a reset, if it comes, ends the stream
            with trio.move_on_after(SETTLE_S):
                if not await stream.read(1 << 16):
                    return


async def _batched(stream: Any, kind: _Kind, run: _Run, rng: random.Random) -> None:
    """A volume identity's frames: the stream's share in a few large writes, no waiting.
    Frames count once their write went through (a write the daemon's reset cut off does not)."""
    target, make = kind.target, MAKERS[kind.name]
    batch, framed = bytearray(), 0
    for _ in range(target.frames_per_stream):
        if kind.left - framed <= 0:
            break
        batch += make(target, rng)
        framed += 1
        if len(batch) >= BATCH_BYTES:
            await stream.write(bytes(batch))
            kind.take(run, framed)
            batch, framed = bytearray(), 0
    if batch:
        await stream.write(bytes(batch))
        kind.take(run, framed)


async def _writer(transport: Any, daemon: str, kind: _Kind, rng: random.Random, run: _Run,
                  stall_hold_s: float) -> None:
    while kind.going and not run.dropped and not run.unsupported:
        try:
            stream = await transport.open_stream(daemon, kind.target.protocol_id)
        except TransportError as exc:
            if _refused_protocol(exc):
                run.open_failures += 1
            elif daemon not in transport.connected_peers():
                run.drop()
            else:  # the daemon reset the stream while it was negotiated (a cap, a fault)
                await trio.sleep(OPEN_RETRY_S)  # pacing a retry, not waiting for a condition
            await trio.sleep(0)
            continue
        try:
            await _one_stream(stream, kind, run, rng, stall_hold_s)
        except TransportError:
            pass  # the daemon reset the stream: the fault was seen
        finally:
            with trio.CancelScope(shield=True):
                await stream.reset()
        if daemon not in transport.connected_peers():
            run.drop()


async def _watch(events: Any, daemon: str, run: _Run, writers: trio.CancelScope) -> None:
    """End the writers when the daemon drops the connection (py-libp2p would redial it
    quietly for the next stream, hiding the drop)."""
    async for event in events:
        if event.peer_id == daemon and not event.connected:
            run.drop()
            writers.cancel()
            return


async def _watch_ban(bans: BanWatch, peer: str, run: _Run, writers: trio.CancelScope) -> None:
    """End the writers once ``/status`` lists the ban: py-libp2p redials for each new stream,
    and a redial may overlap the closing connection, so the drop alone can go unseen."""
    await bans.wait_banned(peer)
    run.drop()
    writers.cancel()


async def _one_identity(config: dict[str, Any], kind: _Kind, ready: Ready, bans: BanWatch,
                        rng: random.Random, verdicts: trio.Nursery) -> str:
    """Attack with one ready identity until it is dropped or the kind is over; returns
    "done", "refused" or "unsupported". Whether it was banned is settled in ``verdicts``."""
    daemon, transport = config["daemon_peer"], ready.transport
    if not ready.error and daemon not in transport.connected_peers():  # dropped already
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            try:
                await greet(transport, config)
            except TransportError as exc:
                ready.error = str(exc)[:300]
        ready.error = ready.error or ("" if daemon in transport.connected_peers()
                                      else "no connection after a redial")
    if ready.error:
        kind.result.refusal = kind.result.refusal or ready.error
        return "refused"
    run = _Run(probe=kind.probes > 0)
    kind.probes -= 1
    streams = STALL_STREAMS if kind.name == "stall" else kind.target.streams_at_once
    events = transport.peer_events()
    with trio.move_on_at(kind.deadline):
        async with trio.open_nursery() as watching:
            watching.start_soon(_watch, events, daemon, run, watching.cancel_scope)
            watching.start_soon(_watch_ban, bans, transport.peer_id, run,
                                watching.cancel_scope)
            async with trio.open_nursery() as writers:
                for _ in range(streams):
                    writers.start_soon(_writer, transport, daemon, kind,
                                       random.Random(rng.random()), run,
                                       config["stall_hold_s"])
            watching.cancel_scope.cancel()
    kind.result.frames += run.frames
    if run.unsupported:
        return "unsupported"
    if run.dropped:
        verdicts.start_soon(_verdict, bans, transport.peer_id, run, kind)
    return "done"


async def _verdict(bans: BanWatch, peer: str, run: _Run, kind: _Kind) -> None:
    """Count ``peer``'s ban, if ``/status`` lists it, for the kind it attacked with."""
    if not await bans.is_banned(peer):
        return
    result = kind.result
    result.bans += 1
    if run.probe:
        result.banned_after.append(run.frames)
    first = round(run.ended_at - kind.started, 2)
    result.first_ban_s = first if result.first_ban_s < 0 else min(result.first_ban_s, first)


async def _identities(config: dict[str, Any], kind: _Kind, bans: BanWatch,
                      rng: random.Random, verdicts: trio.Nursery) -> None:
    """One of the ``IDENTITIES`` loops: a fresh identity after each drop, until the kind ends."""
    while kind.going:
        kind.result.identities += 1
        async with fresh_identity(config, rng.randbytes(32)) as ready:
            how = await _one_identity(config, kind, ready, bans, random.Random(rng.random()),
                                      verdicts)
        if how == "unsupported":
            kind.result.unsupported = True
        kind.refused_in_row = kind.refused_in_row + 1 if how == "refused" else 0
        kind.result.refused += how == "refused"


def kind_share(total: int, sent: int, kinds_left: int) -> int:
    """The frames the next kind may send: an even share of what the kinds before it left of
    ``total`` (a kind the daemon bans at its first frames leaves most of its share to the
    kinds after it)."""
    return max(1, (total - sent) // max(1, kinds_left))


async def attack(config: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(config["seed"])
    attacker = Identity.from_seed(rng.randbytes(32))
    target = target_for(config["protocol_id"], config["network_id"], attacker,
                        config["daemon_peer"], int(time.time() * 1000))
    identities = int(config["identities"])
    bans = BanWatch(config["api_url"])
    out: dict[str, Any] = {}
    sent = 0
    async with trio.open_nursery() as background:
        background.start_soon(bans.run)
        for i, name in enumerate(config["kinds"]):
            now = trio.current_time()
            share = kind_share(int(config["frames_total"]), sent, len(config["kinds"]) - i)
            kind = _Kind(name, target, share, now + float(config["kind_time_s"]), now)
            async with trio.open_nursery() as verdicts:
                for _ in range(identities):
                    verdicts.start_soon(_identities, config, kind, bans,
                                        random.Random(rng.random()), verdicts)
            result = kind.result
            sent += result.frames
            result.elapsed_s = round(trio.current_time() - now, 2)
            result.frames_per_s = round(result.frames / max(result.elapsed_s, 1e-3), 1)
            out[name] = result.__dict__
            if result.unsupported:
                break
        background.cancel_scope.cancel()
    return out

def main() -> None:
    # stdout carries the one JSON result line; logs go to stderr, errors only.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
    )
    config = json.loads(sys.stdin.readline())
    print(json.dumps(trio.run(discover if config.get("discover") else attack, config)),
          flush=True)


if __name__ == "__main__":
    main()
