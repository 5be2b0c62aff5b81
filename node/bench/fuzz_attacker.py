"""The fuzz attacker: a real libp2p peer in its own process, attacking one protocol of a daemon.

``python -m node.bench.fuzz_attacker`` reads one JSON line on stdin and prints one JSON line.
Two requests:

* ``{"discover": true, ...}``: dial the daemon, ask its identify (``/ipfs/id/1.0.0``) which
  protocols it serves, and print ``{"protocols": [...]}``: the bench attacks what the daemon
  says it serves, as an attacker would, so a protocol added to the daemon is attacked too;
* otherwise an attack on ``protocol_id``: for each attack kind, frames are written until
  ``frames_per_kind`` are sent or ``kind_time_s`` has passed; printed per kind: the frames
  written, the identities used, for each identity the daemon banned how many frames it had
  written when the ban was seen, and identities refused at the dial.

How it attacks: ``identities`` identities at once (fresh Ed25519 keys drawn from the seed),
each dialing the daemon and running stream writers side by side (``Target.streams_at_once``;
``stall`` opens ``STALL_STREAMS``). A stream carries ``frames_per_stream`` frames of the
kind (node/bench/fuzz_frames.py): on a request/response protocol one frame, then the write
side is closed and the answer (or the daemon's reset) awaited before the next stream. On
the long-lived protocols the first ``PROBES`` identities of a kind wait for each ping's echo,
or ``SETTLE_S`` for the daemon's reset after each frame, so the ban is seen within a stream
or two of the frame that caused it (their counts are ``banned_after``); the others write
frames back to back, for volume, until the daemon resets the stream. ``bad_length`` and ``stall`` write one frame per stream (a frame
cut short, then the stream's end; half a frame, then nothing until the daemon ends the stream
or ``stall_hold_s`` passes). When the daemon drops the connection, and every ``BAN_POLL_S`` meanwhile, the attacker
asks ``/status`` whether the identity is banned: then it counts the ban and goes on with a fresh
identity (as a real attacker with many keys would), else it redials with the same one. Frames
written after the ban and before the drop reached the attacker count as sent (the daemon
refused them by closing the connection).
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
from node.bench.fuzz_frames import MAKERS, Target, target_for
from node.p2p.frame_checks import identify_answer
from node.p2p.host import open_p2p
from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID, MSG_PROTOCOL_NAME
from node.transport import TransportError
from protocol.codec import encode
from protocol.membership.messages import Hello
from protocol.names import PROTOCOL_VERSION, protocol_id

#: stall streams one identity holds open at once (the daemon caps a peer's streams per
#: protocol at 16 by default: beyond it each stream costs a flood fault)
STALL_STREAMS = 12
CONNECT_TIMEOUT_S = 10.0
#: on a long-lived stream, how long the attacker watches for the daemon's reset after each
#: frame before writing the next (so frames are not written blind into a stream already reset)
SETTLE_S = 0.02
#: after a stream the daemon refused while it was being negotiated, the writer waits this long
OPEN_RETRY_S = 0.05
#: how often an attacking identity asks /status whether it is banned (a ban is seen this late
#: at most, so ``banned_after`` counts up to this long of frames past the ban)
BAN_POLL_S = 1.0
#: identities per kind that attack as probes (each frame once the last one is answered), so
#: ``banned_after`` is exact to a stream or two; the others write frames back to back
PROBES = 3
#: how long a writer waits for the daemon's answer to a one-frame stream
ANSWER_TIMEOUT_S = 15.0
#: how long a writer waits for the daemon to end a long-lived stream it has closed
END_TIMEOUT_S = 1.0
#: a target that refuses this many fresh identities in a row is given up (the daemon is down)
MAX_REFUSED = 3
#: a protocol the daemon refuses this many times (multistream "na"), none written, is not served
UNSUPPORTED_AFTER = 3
#: how py-libp2p's multistream-select failure reads when the far side answers "na"
_NOT_SUPPORTED = "not supported"
#: kinds written once per stream, which then ends (or, for a stall, hangs)
ONE_PER_STREAM = ("bad_length", "stall")
IDENTIFY_ID = "/ipfs/id/1.0.0"


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


@dataclass
class _Run:
    """One identity's attack: frames written, and whether the daemon dropped it."""

    frames: int = 0
    dropped: bool = False
    #: streams the daemon refused to negotiate (it does not serve the protocol)
    open_failures: int = 0
    #: a probe writes each frame only once the daemon has reacted to the last (its ban is
    #: counted in ``banned_after``); the others write back to back, for volume
    probe: bool = True

    @property
    def unsupported(self) -> bool:
        """The daemon refuses every stream on the protocol: it does not serve it."""
        return self.frames == 0 and self.open_failures >= UNSUPPORTED_AFTER


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

    def take(self, run: _Run) -> bool:
        """Count one frame about to be written; False once the budget is spent."""
        if self.left <= 0:
            return False
        self.left -= 1
        run.frames += 1
        return True


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


async def _ack(peer: str, data: bytes) -> bytes:
    return b""  # every request the daemon makes is taken (and ignored)


def _hello(network_id: str) -> bytes:
    return encode(Hello(network_id=network_id, protocol_version=PROTOCOL_VERSION,
                        agent_version="fuzz", listen_addrs=()))


async def _drain(stream: Any, timeout_s: float) -> None:
    """Read until the daemon ends the stream (EOF or reset) or ``timeout_s`` passes."""
    with trio.move_on_after(timeout_s):
        while await stream.read(1 << 16):
            pass


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
        await _drain(stream, ANSWER_TIMEOUT_S)
        return
    echoes = target.framing == "raw"
    for _ in range(target.frames_per_stream):
        if not kind.take(run):
            return
        frame = make(target, rng)
        await stream.write(frame)
        if not run.probe:
            continue
        if echoes:  # a ping's echo paces the next one
            with trio.move_on_after(ANSWER_TIMEOUT_S):
                await stream.read(len(frame))
        else:  # the daemon answers nothing here: a reset, if it comes, ends the stream
            with trio.move_on_after(SETTLE_S):
                if not await stream.read(1 << 16):
                    return
    await stream.close()
    await _drain(stream, END_TIMEOUT_S)  # a long-lived protocol may keep its side open


async def _writer(transport: Any, daemon: str, kind: _Kind, rng: random.Random, run: _Run,
                  stall_hold_s: float) -> None:
    while kind.going and not run.dropped and not run.unsupported:
        try:
            stream = await transport.open_stream(daemon, kind.target.protocol_id)
        except TransportError as exc:
            if _refused_protocol(exc):
                run.open_failures += 1
            elif daemon not in transport.connected_peers():
                run.dropped = True
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
            run.dropped = True


async def _watch(events: Any, daemon: str, run: _Run, writers: trio.CancelScope) -> None:
    """End the writers when the daemon drops the connection (py-libp2p would redial it
    quietly for the next stream, hiding the drop)."""
    async for event in events:
        if event.peer_id == daemon and not event.connected:
            run.dropped = True
            writers.cancel()
            return


async def _watch_ban(api_url: str, peer: str, run: _Run, writers: trio.CancelScope) -> None:
    """End the writers once ``/status`` lists the ban: py-libp2p redials for each new stream,
    and a redial may overlap the closing connection, so the drop alone can go unseen."""
    while not await _is_banned(api_url, peer):
        await trio.sleep(BAN_POLL_S)  # polling the daemon's API: there is no ban event
    run.dropped = True
    writers.cancel()


async def _one_identity(config: dict[str, Any], kind: _Kind, seed: bytes,
                        rng: random.Random) -> str:
    """Attack with one identity until it is banned or the kind is over; returns "banned",
    "done", "refused" or "unsupported"."""
    daemon, addr = config["daemon_peer"], config["daemon_addr"]
    result = kind.result
    streams = STALL_STREAMS if kind.name == "stall" else kind.target.streams_at_once
    async with open_p2p(seed) as transport:
        # a peer that answers no handshake is disconnected within seconds (membership): the
        # attacker passes for an ordinary peer, so that only its attack can get it dropped
        transport.set_request_handler(HANDSHAKE_PROTOCOL_ID, _ack, max_request_bytes=1 << 16)
        transport.set_request_handler(protocol_id(config["network_id"], MSG_PROTOCOL_NAME),
                                      _ack, max_request_bytes=1 << 20)
        run = _Run(probe=kind.probes > 0)
        kind.probes -= 1
        events = transport.peer_events()
        while kind.going:
            with trio.move_on_after(CONNECT_TIMEOUT_S):
                try:
                    await transport.connect(addr)
                    await transport.request(daemon, HANDSHAKE_PROTOCOL_ID,
                                            _hello(config["network_id"]),
                                            max_response_bytes=1 << 10)
                except TransportError as exc:
                    if await _is_banned(config["api_url"], transport.peer_id):
                        break
                    result.refusal = result.refusal or str(exc)[:300]
                    return "refused"
            run.dropped = False
            with trio.move_on_at(kind.deadline):
                async with trio.open_nursery() as watching:
                    watching.start_soon(_watch, events, daemon, run, watching.cancel_scope)
                    watching.start_soon(_watch_ban, config["api_url"], transport.peer_id, run,
                                        watching.cancel_scope)
                    async with trio.open_nursery() as writers:
                        for _ in range(streams):
                            writers.start_soon(_writer, transport, daemon, kind,
                                               random.Random(rng.random()), run,
                                               config["stall_hold_s"])
                    watching.cancel_scope.cancel()
            if run.unsupported:
                return "unsupported"
            if run.dropped and await _is_banned(config["api_url"], transport.peer_id):
                result.frames += run.frames
                result.bans += 1
                if run.probe:
                    result.banned_after.append(run.frames)
                if result.first_ban_s < 0:
                    result.first_ban_s = round(trio.current_time() - kind.started, 2)
                return "banned"
        result.frames += run.frames
        return "done"


async def _identities(config: dict[str, Any], kind: _Kind, rng: random.Random) -> None:
    """One of the ``IDENTITIES`` loops: a fresh identity after each ban, until the kind ends."""
    while kind.going:
        kind.result.identities += 1
        how = await _one_identity(config, kind, rng.randbytes(32),
                                  random.Random(rng.random()))
        if how == "unsupported":
            kind.result.unsupported = True
        kind.refused_in_row = kind.refused_in_row + 1 if how == "refused" else 0
        kind.result.refused += how == "refused"


async def attack(config: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(config["seed"])
    attacker = Identity.from_seed(rng.randbytes(32))
    target = target_for(config["protocol_id"], config["network_id"], attacker,
                        config["daemon_peer"], int(time.time() * 1000))
    out: dict[str, Any] = {}
    for name in config["kinds"]:
        now = trio.current_time()
        kind = _Kind(name, target, int(config["frames_per_kind"]),
                     now + float(config["kind_time_s"]), now)
        async with trio.open_nursery() as nursery:
            for _ in range(int(config["identities"])):
                nursery.start_soon(_identities, config, kind, random.Random(rng.random()))
        out[name] = kind.result.__dict__
        if kind.result.unsupported:
            break
    return out


async def discover(config: dict[str, Any]) -> dict[str, Any]:
    """The protocols the daemon says it serves, from its identify answer."""
    async with open_p2p(random.Random(config["seed"]).randbytes(32)) as transport:
        await transport.connect(config["daemon_addr"])
        stream = await transport.open_stream(config["daemon_peer"], IDENTIFY_ID)
        data = b""
        with trio.fail_after(CONNECT_TIMEOUT_S):
            while chunk := await stream.read(1 << 16):  # the daemon closes after its answer
                data += chunk
        await stream.close()
        length, at = 0, 0
        while data[at] & 0x80:  # the answer's varint length prefix
            length |= (data[at] & 0x7F) << (7 * at)
            at += 1
        length |= data[at] << (7 * at)
        protocols, agent = identify_answer(data[at + 1:at + 1 + length])
        return {"protocols": sorted(protocols), "agent": agent}


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
