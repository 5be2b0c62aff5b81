"""The fuzz attacker's identities and its view of the daemon's bans.

* :func:`fresh_identity`: a fresh libp2p identity, started, connected to the daemon and
  greeted (the handshake answered, so it passes for an ordinary peer). Each identity is
  started when it is needed and stopped when it is done, not drawn from a pool started ahead
  of time: with such a pool the daemon stopped receiving the attacker's handshakes partway
  through a full run and the run outlived its time limit (the cause is not known).
* :class:`BanWatch`: one ``GET /status`` every ``POLL_S`` for every identity of the process
  (each identity polling on its own added several requests a second to the daemon whose
  ``/status`` latency the bench measures); an identity waits for the poll that lists it.
* :func:`discover`: the protocols the daemon serves, from its identify answer.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from node.p2p.frame_checks import identify_answer
from node.p2p.host import open_p2p
from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID, MSG_PROTOCOL_NAME
from node.transport import TransportError
from protocol.codec import encode
from protocol.membership.messages import Hello
from protocol.names import PROTOCOL_VERSION, protocol_id

#: a dial and handshake beside a busy daemon take seconds; beyond this, given up
CONNECT_TIMEOUT_S = 20.0
IDENTIFY_ID = "/ipfs/id/1.0.0"
#: how often the daemon's /status is asked which identities it has banned
POLL_S = 0.5


@dataclass
class Ready:
    """An identity started and (unless ``error``) connected and greeted."""

    transport: Any
    error: str = ""


async def _ack(peer: str, data: bytes) -> bytes:
    return b""  # every request the daemon makes is taken (and ignored)


def hello(network_id: str) -> bytes:
    return encode(Hello(network_id=network_id, protocol_version=PROTOCOL_VERSION,
                        agent_version="fuzz", listen_addrs=()))


async def greet(transport: Any, config: dict[str, Any]) -> None:
    """Dial the daemon and send it our Hello (TransportError if it refuses)."""
    await transport.connect(config["daemon_addr"])
    await transport.request(config["daemon_peer"], HANDSHAKE_PROTOCOL_ID,
                            hello(config["network_id"]), max_response_bytes=1 << 10)


@asynccontextmanager
async def fresh_identity(config: dict[str, Any], seed: bytes) -> AsyncIterator[Ready]:
    """A new identity, started, connected to the daemon and greeted (unless ``error``), for
    the duration of the block; its host is stopped after it."""
    async with open_p2p(seed) as transport:
        # a peer that answers no handshake is disconnected within seconds (membership): the
        # attacker answers, so that only its attack can get it dropped
        transport.set_request_handler(HANDSHAKE_PROTOCOL_ID, _ack, max_request_bytes=1 << 16)
        transport.set_request_handler(protocol_id(config["network_id"], MSG_PROTOCOL_NAME),
                                      _ack, max_request_bytes=1 << 20)
        ready = Ready(transport)
        with trio.move_on_after(CONNECT_TIMEOUT_S) as scope:
            try:
                await greet(transport, config)
            except TransportError as exc:
                ready.error = str(exc)[:300]
        if scope.cancelled_caught:
            ready.error = f"dial and handshake took over {CONNECT_TIMEOUT_S} s"
        yield ready


class BanWatch:
    """The peers the daemon's ``/status`` lists as banned, asked every ``POLL_S``."""

    def __init__(self, api_url: str) -> None:
        self._api_url = api_url
        self.banned: set[str] = set()
        self._polled = trio.Event()

    async def run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while True:
                self.banned = await trio.to_thread.run_sync(self._ask, client)
                self._polled.set()
                self._polled = trio.Event()
                await trio.sleep(POLL_S)  # polling the daemon's API: there is no ban event

    def _ask(self, client: httpx.Client) -> set[str]:
        try:
            return set(client.get(self._api_url + "/status").json().get("banned", {}))
        except (httpx.HTTPError, ValueError):
            return self.banned  # unanswered this time: what the last poll said

    async def is_banned(self, peer: str) -> bool:
        """Whether the daemon lists ``peer`` as banned, as of a poll that started from now
        (the one under way may have asked before the ban: the one after it did not)."""
        for _ in range(2):
            if peer in self.banned:
                return True
            await self._polled.wait()
        return peer in self.banned

    async def wait_banned(self, peer: str) -> None:
        while peer not in self.banned:
            await self._polled.wait()


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
