"""The checker's side of a per-position stage check: a stage's committed keys and values (K/V)
loaded into a session, and rows recomputed at their own positions on them.

Contract
--------
A stage's output at a step depends on every earlier position only through its attention
cache, so a step can be recomputed alone: its input rows at their own positions, every layer
attending to the K/V the stage committed to (protocol.inference.stage_checks). A requester
opens an ordinary session on the checked stage's blocks at a server that holds them, then:

* ``CommittedKv(start_pos, n, kv)`` appends ``n`` positions of K/V to the session's cache,
  computing nothing (``start_pos`` at most the cached length: below it the cache is cut back
  first, as a Forward does); answered by ``SessionAck`` with the new length. The driver
  writes the rows (``LoadKv``) and reports ``KvLoaded``, or ``ForwardFailed`` with
  ``bad_input`` when they are not finite.
* ``Recheck(positions, data)`` recomputes one row per position, each attending to the cached
  K/V up to its own position (every position below the cached length); answered by a
  ``RecheckResult``: the rows' outputs and the K/V rows they would have appended, fp32. The
  driver computes (``RunRecheck``) and reports ``RecheckDone`` (or ``ForwardFailed``).

Both take the session's slot as a Forward does (one request at a time); a wrong byte count, a
position past the cache, a start past it or past ``max_length``, or a result that would not
fit one frame is malformed: the session ends and the sender is penalized (the session
machine's rule, protocol.inference.session).

K/V layout: per position, per block of the session in order, the keys' row then the values'
row, each ``kv_heads * head_dim`` little-endian fp32 values: ``kv_row_bytes`` bytes a
position, the attention-cache bytes one position costs (``ServedBlocks.cache_bytes_per_block``
times the blocks). Pure logic: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.inference.messages import MAX_STATES_BYTES, CommittedKv, Precision, Recheck


def kv_row_bytes(cache_bytes_per_block: int, blocks: int) -> int:
    """The K/V bytes one position of ``blocks`` blocks takes (the layout above)."""
    return cache_bytes_per_block * blocks


@dataclass(frozen=True, slots=True)
class LoadKv:
    """Write ``kv`` (n positions from start_pos) into the session's cache (cut to start_pos)."""

    session_id: bytes
    start: int
    end: int
    start_pos: int
    n: int
    kv: bytes


@dataclass(frozen=True, slots=True)
class KvLoaded:
    session_id: bytes
    length: int


@dataclass(frozen=True, slots=True)
class RunRecheck:
    """Recompute blocks [start, end) over ``data`` at ``positions`` on the session's cache."""

    session_id: bytes
    start: int
    end: int
    positions: tuple[int, ...]
    data: bytes
    precision: Precision


@dataclass(frozen=True, slots=True)
class RecheckDone:
    session_id: bytes
    #: (rows, hidden) and (rows, kv_row_bytes / 4), little-endian fp32
    outputs: bytes
    kv: bytes


def kv_problem(msg: CommittedKv, cached: int, max_length: int, row_bytes: int) -> str:
    """Why ``msg`` cannot be loaded into a session holding ``cached`` positions ("" if it can)."""
    if len(msg.kv) != msg.n * row_bytes:
        return f"committed K/V: {len(msg.kv)} bytes, expected {msg.n} x {row_bytes}"
    if msg.start_pos > cached:
        return f"committed K/V from {msg.start_pos}, {cached} held"
    if msg.start_pos + msg.n > max_length:
        return f"committed K/V past max_length {max_length}"
    return ""


def recheck_problem(msg: Recheck, cached: int, hidden_size: int, precision: Precision,
                    row_bytes: int) -> str:
    """Why ``msg`` cannot be recomputed on a session holding ``cached`` positions ("" if it
    can: rows of the right size, every position cached, a result within one frame)."""
    rows = len(msg.positions)
    if rows == 0:
        return "a recheck of no rows"
    if len(msg.data) != rows * hidden_size * precision.itemsize:
        return f"recheck: {len(msg.data)} bytes for {rows} rows of {hidden_size}"
    if max(msg.positions) >= cached:
        return f"recheck at position {max(msg.positions)}, {cached} held"
    if rows * (hidden_size * 4 + row_bytes) > MAX_STATES_BYTES:
        return f"a recheck of {rows} rows does not fit one result"
    return ""
