"""The requester's side of a per-position stage check (rules: protocol/inference/recheck.py):
a checked hop's blocks recomputed at another server, on the hop's committed K/V.

:func:`on_checker` runs work on a one-hop session of the hop's blocks at a server whose offer
covers them, other than the hop itself and the excluded, in the order ranked from the chain's
nonce (so a stage cannot choose its checker); a checker that fails is reported and the next
one tried. :func:`recheck_rows` loads the committed K/V into such a session, a frame at a time
(``CommittedKv``, each acknowledged), then asks for the checked rows (``Recheck``, as many a
frame as their results fit) and returns the recompute: outputs and K/V rows. What a checker
answers is hostile like any peer's bytes: a result of the wrong size or with values that are
not finite is its fault (HopFailed, penalized).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import numpy as np

from crypto.hashing import digest
from node.inference.chain import Chain
from node.inference.hops import HopFailed, HopSession
from node.inference.wire import pack_hidden
from protocol.inference.messages import (
    MAX_RECHECK_ROWS,
    MAX_STATES_BYTES,
    CommittedKv,
    Recheck,
    RecheckResult,
    SessionAck,
    max_positions_per_frame,
)
from protocol.inference.routing import Hop
from protocol.verification.rules import rank_verifiers

T = TypeVar("T")


async def on_checker(chain: Chain, hop: HopSession,
                     work: Callable[[HopSession], Awaitable[T]]) -> T | None:
    """``work`` on a one-hop session of ``hop``'s blocks at another server (module
    docstring); None when no server could do it."""
    a, b = hop.hop.start, hop.hop.end
    covering = {s.peer for s in chain.directory.servers()
                if s.model == chain.model and s.start <= a and b <= s.end}
    ranked = rank_verifiers(digest(chain.nonce + hop.session_id), covering,
                            {hop.peer, *chain.excluded})
    for peer in ranked:
        try:
            session = await chain._open_hop(Hop(peer, a, b), os.urandom(16), "", ("", b""))
        except HopFailed as exc:
            await chain._fail(exc)
            continue
        try:
            return await work(session)
        except HopFailed as exc:
            await chain._fail(exc)
        finally:
            await chain._close_hop(session)
    return None


async def recheck_rows(chain: Chain, hop: HopSession, kv: np.ndarray, positions: np.ndarray,
                       rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``rows`` (k, C) at ``positions`` (k,) through ``hop``'s blocks on the committed ``kv``
    (T, kv floats a position) of positions 0..T-1, at a checker: (outputs (k, C), K/V rows
    (k, kv floats)) fp32, or None when no server could (or one position's K/V pass a frame)."""
    if kv.shape[1] * 4 > MAX_STATES_BYTES:
        return None
    return await on_checker(chain, hop, partial(_recheck, chain, kv, positions, rows))


async def _recheck(chain: Chain, kv: np.ndarray, positions: np.ndarray, rows: np.ndarray,
                   s: HopSession) -> tuple[np.ndarray, np.ndarray]:
    width = kv.shape[1]
    per = MAX_STATES_BYTES // (width * 4)
    for a in range(0, len(kv), per):
        piece = kv[a:a + per]
        await chain._send(s, CommittedKv(session_id=s.session_id, start_pos=a, n=len(piece),
                                         kv=piece.astype("<f4").tobytes()))
        ack = await chain._expect(s, (SessionAck,))
        if not isinstance(ack, SessionAck) or ack.length != a + len(piece):
            raise HopFailed(s.peer, "acknowledged committed K/V it did not hold", bad_data=True)
    hidden = chain.hidden_size
    per_row = min(MAX_RECHECK_ROWS, MAX_STATES_BYTES // ((hidden + width) * 4),
                  max_positions_per_frame(hidden, chain.precision))
    outs, news = [], []
    for a in range(0, len(positions), per_row):
        at = positions[a:a + per_row]
        await chain._send(s, Recheck(session_id=s.session_id, positions=tuple(map(int, at)),
                                     data=pack_hidden(rows[a:a + per_row], chain.precision)))
        reply = await chain._expect(s, (RecheckResult,))
        assert isinstance(reply, RecheckResult)
        out, new = _result(s, reply, len(at), hidden, width)
        outs.append(out)
        news.append(new)
    return np.concatenate(outs), np.concatenate(news)


def _result(s: HopSession, reply: RecheckResult, k: int, hidden: int,
            width: int) -> tuple[np.ndarray, np.ndarray]:
    """A checker's answer for ``k`` rows, decoded; HopFailed (its fault) when malformed."""
    if len(reply.outputs) != k * hidden * 4 or len(reply.kv) != k * width * 4:
        raise HopFailed(s.peer, f"a recheck result of the wrong size for {k} rows",
                        bad_data=True)
    out = np.frombuffer(reply.outputs, "<f4").reshape(k, hidden)
    new = np.frombuffer(reply.kv, "<f4").reshape(k, width)
    if not (np.isfinite(out).all() and np.isfinite(new).all()):
        raise HopFailed(s.peer, "a recheck result with non-finite values", bad_data=True)
    return out.astype(np.float32), new.astype(np.float32)
