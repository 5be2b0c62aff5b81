"""Routing a chain of block servers, and choosing which blocks a server should hold.

Contract
--------
* :func:`plan_chain` covers blocks [start, end) of a model with a sequence of :class:`Hop`s,
  each a server and the contiguous sub-range it computes. It is a shortest path over block
  boundaries: an edge from boundary ``i`` to ``j`` through server ``s`` exists when ``s``
  serves every block in [i, j); its cost per generated token is ``s``'s measured round trip
  plus ``(j - i) * ms_per_block`` plus a load penalty plus ``HOP_MS`` (:func:`hop_cost`). Servers in
  ``excluded`` (failed recently), without a free session slot, or without cache room for the
  session are not used. Ties go to fewer hops, then to the smaller peer id, so the plan is a
  pure function of its inputs. :class:`NoRoute` names the first block nobody covers.
* :func:`missing_blocks` lists the ranges of a model's blocks that no offer covers (what a
  requester waits for, and names when it gives up); :func:`blocks_text` says them in words.
* :func:`choose_blocks` is ``--serve-blocks auto``: among the windows of ``span`` contiguous
  blocks, the one whose current coverage (the sum of the covering servers' speed,
  1 / ms_per_block, this node's own offer left out) is weakest; the current window is kept
  unless the best one is weaker by more than ``hysteresis`` (a fraction), so servers do not
  flap. The caller moves only between sessions. :func:`span_for` sizes the window from the
  node's free memory and speed.

Pure logic: the ledger's offers, measured round trips and the exclusion set come in as
arguments; nothing here reads a clock or draws a random number.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

#: cost (ms per token) added to a server that has no free session slot left after ours
FULL_PENALTY_MS = 1000.0
#: cost (ms per token) added in proportion to the fraction of a server's slots in use
LOAD_PENALTY_MS = 20.0
#: round trip assumed for a server never measured
DEFAULT_RTT_MS = 50.0
#: cost (ms per token) of a hop itself, whatever its round trip: a session step's framing and
#: codecs. It also keeps a server with a round trip of 0 (the requester's own stage) one hop:
#: cut in pieces its cost would tie, and float rounding could favour the pieces
HOP_MS = 1.0
#: ``choose_blocks`` moves only when the best window is this much weaker than the current one
HYSTERESIS = 0.25


class NoRoute(Exception):
    """No chain covers the requested blocks; ``block`` is the first one nobody serves."""

    def __init__(self, model: str, block: int) -> None:
        super().__init__(f"no server of {model!r} covers block {block}")
        self.model = model
        self.block = block


@dataclass(frozen=True, slots=True)
class Server:
    """One server's offer, as the ledger carries it."""

    peer: str
    model: str
    start: int
    end: int
    ms_per_block: float
    free_sessions: int
    max_sessions: int
    free_cache_bytes: int


@dataclass(frozen=True, slots=True)
class Hop:
    peer: str
    start: int
    end: int


def hop_cost(server: Server, blocks: int, rtt_ms: float) -> float:
    """Expected milliseconds per token of computing ``blocks`` blocks on ``server``."""
    used = 1.0 - server.free_sessions / server.max_sessions if server.max_sessions else 1.0
    penalty = LOAD_PENALTY_MS * used + (FULL_PENALTY_MS if server.free_sessions <= 1 else 0.0)
    return HOP_MS + rtt_ms + blocks * server.ms_per_block + penalty


def _usable(servers: Sequence[Server], model: str, excluded: Collection[str],
            cache_bytes_per_block: int) -> list[Server]:
    out = []
    for s in servers:
        if s.model != model or s.peer in excluded or s.free_sessions <= 0:
            continue
        if s.free_cache_bytes < cache_bytes_per_block * (s.end - s.start):
            continue
        out.append(s)
    return sorted(out, key=lambda s: (s.peer, s.start))


def plan_chain(servers: Sequence[Server], model: str, start: int, end: int, *,
               rtt_ms: Mapping[str, float] | None = None,
               excluded: Collection[str] = (),
               cache_bytes_per_block: int = 0) -> list[Hop]:
    """The cheapest chain covering blocks [start, end) (see the module contract).

    ``cache_bytes_per_block``: the session's cache need per block (positions x bytes per
    position per block); a server with less free cache memory for its range is skipped.
    """
    if not 0 <= start < end:
        raise ValueError(f"empty or negative block range [{start}, {end})")
    rtts = rtt_ms or {}
    usable = _usable(servers, model, excluded, cache_bytes_per_block)
    # Dijkstra over boundaries start..end; a label is (cost, hops, peers) so ties are stable
    best: dict[int, tuple[float, int, tuple[str, ...]]] = {start: (0.0, 0, ())}
    back: dict[int, tuple[int, Hop]] = {}
    queue: list[tuple[float, int, tuple[str, ...], int]] = [(0.0, 0, (), start)]
    while queue:
        cost, hops, peers, i = heapq.heappop(queue)
        if (cost, hops, peers) != best.get(i) or i == end:
            continue
        for s in usable:
            if not s.start <= i < s.end:
                continue
            rtt = rtts.get(s.peer, DEFAULT_RTT_MS)
            for j in range(i + 1, min(s.end, end) + 1):
                label = (cost + hop_cost(s, j - i, rtt), hops + 1, (*peers, s.peer))
                if j not in best or label < best[j]:
                    best[j] = label
                    back[j] = (i, Hop(s.peer, i, j))
                    heapq.heappush(queue, (*label, j))
    if end not in best:
        reached = max((b for b in best), default=start)
        raise NoRoute(model, reached)
    chain: list[Hop] = []
    at = end
    while at != start:
        at, hop = back[at]
        chain.append(hop)
    return chain[::-1]


def coverage(servers: Sequence[Server], model: str, n_blocks: int,
             exclude_peer: str = "") -> list[float]:
    """Per block, the summed speed (blocks per ms) of the servers covering it."""
    cover = [0.0] * n_blocks
    for s in servers:
        if s.model != model or s.peer == exclude_peer:
            continue
        speed = 1.0 / max(s.ms_per_block, 1e-3)
        for b in range(max(0, s.start), min(n_blocks, s.end)):
            cover[b] += speed
    return cover


def missing_blocks(servers: Sequence[Server], model: str, n_blocks: int) -> list[tuple[int, int]]:
    """The maximal ranges [a, b) of blocks 0..n_blocks of ``model`` that no server offers."""
    cover = coverage(servers, model, n_blocks)
    out: list[tuple[int, int]] = []
    for b, speed in enumerate(cover):
        if speed > 0.0:
            continue
        if out and out[-1][1] == b:
            out[-1] = (out[-1][0], b + 1)
        else:
            out.append((b, b + 1))
    return out


def blocks_text(ranges: Sequence[tuple[int, int]]) -> str:
    """``[(15, 30), (40, 41)]`` -> ``"blocks 15-30 and 40-41"`` (ends exclusive, as offers)."""
    parts = [f"{a}-{b}" for a, b in ranges]
    if not parts:
        return "no blocks"
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"blocks {joined}"


def span_for(n_blocks: int, bytes_per_block: int, free_memory_bytes: int,
             memory_fraction: float = 0.5) -> int:
    """How many blocks this node should hold: what ``memory_fraction`` of its free memory
    fits, at least one, at most the whole model."""
    if bytes_per_block <= 0:
        return n_blocks
    fits = int(free_memory_bytes * memory_fraction) // bytes_per_block
    return max(1, min(n_blocks, fits))


def choose_blocks(servers: Sequence[Server], model: str, n_blocks: int, span: int, *,
                  own_peer: str, current: tuple[int, int] | None = None,
                  hysteresis: float = HYSTERESIS) -> tuple[int, int]:
    """The window [a, a + span) to serve (see the module contract)."""
    if not 1 <= span <= n_blocks:
        raise ValueError(f"a span of {span} blocks in a model of {n_blocks}")
    cover = coverage(servers, model, n_blocks, exclude_peer=own_peer)

    def weakness(a: int) -> tuple[float, float]:
        window = cover[a:a + span]
        return (min(window), sum(window))  # the weakest block first, then the whole window

    best = min(range(n_blocks - span + 1), key=lambda a: (weakness(a), a))
    if current is None or current[1] - current[0] != span or current[1] > n_blocks:
        return best, best + span
    held_min, held_sum = weakness(current[0])
    new_min, new_sum = weakness(best)
    if held_min == 0.0 and new_min == 0.0:
        return current  # both leave a hole somebody must fill; moving gains nothing certain
    if new_min < held_min * (1.0 - hysteresis) or (
            math.isclose(new_min, held_min) and new_sum < held_sum * (1.0 - hysteresis)):
        return best, best + span
    return current


def parse_serve_blocks(text: str) -> str | tuple[int, int] | None:
    """"" -> None (off), "auto", or "A:B" -> (A, B); ValueError naming the value otherwise."""
    text = text.strip()
    if not text:
        return None
    if text == "auto":
        return "auto"
    a, sep, b = text.partition(":")
    if sep and a.isdigit() and b.isdigit() and int(a) < int(b):
        return int(a), int(b)
    raise ValueError(f"must be 'auto' or 'A:B' with A < B, got {text!r}")
