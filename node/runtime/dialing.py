"""Dialing a peer's addresses side by side ("happy eyeballs", after RFC 8305).

:func:`dial_first` starts a dial to the first address, then one to the next address
``stagger_s`` later, or at once when every dial started so far has failed, and so on down the
list; the first dial that connects wins and the ones still running are cancelled. So a peer
is reached in the time of its fastest address: a node behind a NAT whose private address
comes first (a dial that hangs until the transport's dial timeout) is reached through its
next address a stagger later, not after that timeout. A dial that connects just before the
winner's cancellation lands leaves a second connection to the peer: the transport closes it
(node/p2p/swarm.py, ``OwnDials``). When every dial fails, the outcome lists each address's
failure, each naming its address.

:func:`dial_plan` puts the addresses in the order they are tried: each one names the peer
(``/p2p/<peer>`` appended where missing; one naming another peer is an error, not a dial),
direct addresses before relayed ones (``/p2p-circuit``: slower, and they spend a relay's
capacity), otherwise in the order given.

``connect`` is the transport's ``connect``: one attempt to one address, failing with
:class:`node.transport.TransportError` in bounded time (node/transport.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from node.transport import TransportError
from protocol.names import peer_id_of_multiaddr

#: the head start each dial gets before the next address is dialed too (RFC 8305's default)
DIAL_STAGGER_S = 0.25


@dataclass(frozen=True, slots=True)
class DialOutcome:
    #: the address that connected; None when none did
    addr: str | None
    #: why each failed dial failed, in the order they failed (cancelled ones are not listed),
    #: each naming its address
    errors: tuple[str, ...]


def dial_plan(peer: str, addrs: Iterable[str]) -> tuple[list[str], list[str]]:
    """The addresses to dial, in order, and the errors of those that cannot be (module doc)."""
    direct: list[str] = []
    relayed: list[str] = []
    errors: list[str] = []
    for addr in addrs:
        named = peer_id_of_multiaddr(addr)
        if named is None:
            addr = f"{addr.rstrip('/')}/p2p/{peer}"
        elif named != peer:
            errors.append(f"{addr}: names another peer")
            continue
        (relayed if "/p2p-circuit" in addr else direct).append(addr)
    return direct + relayed, errors


async def dial_first(connect: Callable[[str], Awaitable[object]], addrs: Sequence[str], *,
                     stagger_s: float = DIAL_STAGGER_S) -> DialOutcome:
    """Dial ``addrs`` side by side, staggered; the first to connect wins (module doc)."""
    won: list[str] = []
    errors: list[str] = []
    running = 0
    all_failed = trio.Event()

    async def attempt(addr: str, nursery: trio.Nursery) -> None:
        nonlocal running, all_failed
        try:
            await connect(addr)
        except TransportError as exc:
            reason = str(exc)  # the transport's own message names the address, mostly
            errors.append(reason if addr in reason else f"{addr}: {reason}")
            running -= 1
            if not running:
                all_failed.set()
            return
        if not won:
            won.append(addr)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for addr in addrs:
            running += 1
            all_failed = trio.Event()
            nursery.start_soon(attempt, addr, nursery)
            with trio.move_on_after(stagger_s):
                await all_failed.wait()
    return DialOutcome(won[0] if won else None, tuple(errors))
