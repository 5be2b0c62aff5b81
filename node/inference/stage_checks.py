"""The requester's stage checks over a finished chain (rules: protocol/inference/stage_checks.py).

:func:`check_chain` runs after a generation, before the chain's sessions close. For each hop
(this node's own stage aside) it takes the hop's signed commitments (node.inference.hops keeps
them), selects the checked steps by the unsteerable draw, and when any is selected:

1. asks the hop for its logged steps up to the last selected one (``StatesAsk``, page by
   page), their frames and the K/V rows they appended, and checks every frame and every K/V
   row against the step's signed commitment, the first hop's inputs against what the
   requester sent, and every other hop's input digests against its upstream's output digests;
2. has only the selected steps recomputed by another server whose offer covers the hop's
   blocks (a one-hop session of its own, ranked from the nonce so the stage cannot choose its
   checker): the committed K/V loaded into that session (``CommittedKv``), then every
   selected step's input rows at their own positions in one ``Recheck``
   (protocol.inference.recheck);
3. compares each selected step's output rows and K/V rows with the recompute; beyond the
   tolerance the hop is convicted.

The recompute costs the selected rows only, not the positions before them. When the hop's
logged steps do not fit the pages with their K/V (a step, a long prefill, whose frames and
K/V alone pass a frame), the check falls back to fetching the frames alone and recomputing
the hop's blocks on its committed inputs from position 0 in one prefill, comparing outputs.
The generation's output is the honest chain's only if nothing was convicted, so the
requester (node.inference.requester) runs it again without the convicted stages. A hop with
selected steps and no server able to recompute it is reported ``unchecked``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from models.stage_kv import row_error
from node.inference.chain import Chain
from node.inference.hops import HopFailed, HopSession
from node.inference.recheck import on_checker, recheck_rows
from node.inference.wire import unpack_hidden
from protocol.errors import InvalidMessage
from protocol.inference.messages import StageCommit, StatesAsk, StatesReply
from protocol.inference.stage_checks import (
    commit_ok,
    conviction,
    disagrees,
    error_detail,
    frames_problem,
    inputs_agree,
    step_checked,
)
from protocol.inference.stage_log import unpack_steps
from protocol.ledger.events import Attest


@dataclass
class CheckReport:
    #: hops whose selected steps were recomputed, and how many steps that covered
    checked: list[str] = field(default_factory=list)
    steps_checked: int = 0
    #: hops checked by a recompute from position 0 (their K/V did not fit the pages)
    prefilled: list[str] = field(default_factory=list)
    #: hops with selected steps that no server could recompute
    unchecked: list[str] = field(default_factory=list)
    #: stages convicted, with their attestations
    convicted: list[Attest] = field(default_factory=list)
    #: peers sent away unconvicted (disagreeing digests, unusable frames)
    dropped: list[str] = field(default_factory=list)
    check_s: float = 0.0


@dataclass
class _Logged:
    commit: StageCommit
    start_pos: int
    rows: int
    inputs: np.ndarray
    outputs: np.ndarray
    #: (rows, kv floats a position) fp32; (rows, 0) when fetched without K/V
    kv: np.ndarray


async def check_chain(chain: Chain, rate: float, me: str = "") -> CheckReport:
    """Check ``chain``'s hops (see the module docstring); the chain stays open."""
    report = CheckReport()
    started = time.perf_counter()
    for i, hop in enumerate(chain.hops):
        if hop.peer == me or hop.closed:
            continue
        try:
            await _check_hop(chain, i, rate, report)
        except HopFailed as exc:  # a checker or the hop broke off: no verdict on the hop
            await chain._fail(exc)
            report.dropped.extend(exc.peers)
    report.check_s = time.perf_counter() - started
    return report


async def _check_hop(chain: Chain, i: int, rate: float, report: CheckReport) -> None:
    hop = chain.hops[i]
    selected = {c.step for c in hop.commits.values()
                if commit_ok(hop.peer, c) and step_checked(chain.nonce, hop.peer, c, rate)}
    ends = [min(c.start_pos + c.n, chain.length) for c in hop.commits.values()
            if c.step in selected]
    end_pos = max(ends, default=0)
    if end_pos <= 0:
        return
    with_kv = True
    logged = await _fetch(chain, hop, end_pos, with_kv)
    if logged is None:  # a step too large with its K/V: the frames alone, and a prefill
        with_kv = False
        logged = await _fetch(chain, hop, end_pos, with_kv)
    if logged is None:
        report.unchecked.append(hop.peer)
        return
    bad = _bad_frames(chain, i, logged)
    if bad is not None:
        report.convicted.append(conviction(hop.peer, bad[0], chain.nonce, bad[1]))
        return
    upstream = chain.hops[i - 1].commits if i else {}
    if any(not inputs_agree(e.commit, upstream) for e in logged):
        raise HopFailed(hop.peer, "its inputs disagree with its upstream's outputs",
                        also=(chain.hops[i - 1].peer,))
    checks = [e for e in logged if e.commit.step in selected and e.rows]
    if not checks:
        return
    errors = await (_per_position(chain, hop, logged, checks) if with_kv
                    else _prefill(chain, hop, logged, checks))
    if errors is None:
        report.unchecked.append(hop.peer)
        return
    report.checked.append(hop.peer)
    report.steps_checked += len(checks)
    if not with_kv:
        report.prefilled.append(hop.peer)
    for e, err in zip(checks, errors, strict=True):
        if disagrees(err):
            report.convicted.append(conviction(hop.peer, e.commit, chain.nonce,
                                               error_detail(err)))
            return


async def _per_position(chain: Chain, hop: HopSession, logged: list[_Logged],
                        checks: list[_Logged]) -> list[float] | None:
    """Each checked step's worst row error, outputs and K/V rows, against a recompute of its
    rows alone on the committed K/V; None when no server could recompute them."""
    end = max(e.start_pos + e.rows for e in checks)
    kv = np.concatenate([e.kv for e in logged])[:end]
    positions = np.concatenate([np.arange(e.start_pos, e.start_pos + e.rows) for e in checks])
    rows = np.concatenate([e.inputs for e in checks])
    reference = await recheck_rows(chain, hop, kv, positions, rows)
    if reference is None:
        return None
    out, new = reference
    errors, at = [], 0
    for e in checks:
        part = slice(at, at + e.rows)
        errors.append(max(row_error(e.outputs, out[part]), row_error(e.kv, new[part])))
        at += e.rows
    return errors


async def _prefill(chain: Chain, hop: HopSession, logged: list[_Logged],
                   checks: list[_Logged]) -> list[float] | None:
    """Each checked step's worst output row error against a recompute of the hop's blocks on
    its committed inputs from position 0 (the fallback: no K/V)."""
    reference = await _recompute(chain, hop, np.concatenate([e.inputs for e in logged]))
    if reference is None:
        return None
    return [row_error(e.outputs, reference[e.start_pos:e.start_pos + e.rows]) for e in checks]


async def _fetch(chain: Chain, hop: HopSession, end_pos: int,
                 with_kv: bool) -> list[_Logged] | None:
    """The hop's logged steps below ``end_pos`` (with their K/V or without), rows cut where
    the next step starts; None when a step is too large to send. Malformed pages are the
    hop's fault (HopFailed)."""
    table: list[tuple[int, int, int]] = []
    inputs, outputs, kv = bytearray(), bytearray(), bytearray()
    total = None
    while total is None or len(table) < total:
        await chain._send(hop, StatesAsk(session_id=hop.session_id, end_pos=end_pos,
                                         first=len(table), kv=with_kv))
        page = await chain._expect(hop, (StatesReply,))
        assert isinstance(page, StatesReply)
        try:
            entries = unpack_steps(page.steps)
        except ValueError as exc:
            raise HopFailed(hop.peer, str(exc), bad_data=True) from exc
        if page.first != len(table) or (total is not None and page.total != total):
            raise HopFailed(hop.peer, "a states page out of order", bad_data=True)
        if not with_kv and page.kv:
            raise HopFailed(hop.peer, "K/V in a states page asked without", bad_data=True)
        if not entries:
            return None if page.total > len(table) else _cut(chain, hop, table, (
                inputs, outputs, kv), end_pos, with_kv)
        total = page.total
        table += entries
        inputs += page.inputs
        outputs += page.outputs
        kv += page.kv
    return _cut(chain, hop, table, (inputs, outputs, kv), end_pos, with_kv)


def _cut(chain: Chain, hop: HopSession, table: list[tuple[int, int, int]],
         data: tuple[bytes, bytes, bytes], end_pos: int, with_kv: bool) -> list[_Logged]:
    inputs, outputs, kv = data
    size = chain.hidden_size * chain.precision.itemsize
    kv_row = chain.kv_bytes_per_block * (hop.hop.end - hop.hop.start) if with_kv else 0
    positions = sum(n for _, _, n in table)
    if positions * size != len(inputs) or len(inputs) != len(outputs) or \
            positions * kv_row != len(kv):
        raise HopFailed(hop.peer, "states pages of the wrong size", bad_data=True)
    out, offset, kv_at, pos = [], 0, 0, 0
    for k, (step, start_pos, n) in enumerate(table):
        if start_pos != pos:
            raise HopFailed(hop.peer, f"logged steps leave a gap at {pos}", bad_data=True)
        nxt = table[k + 1][1] if k + 1 < len(table) else end_pos
        rows = max(0, min(n, nxt - start_pos))
        raw_in, raw_out = (bytes(b[offset:offset + n * size]) for b in (inputs, outputs))
        raw_kv = bytes(kv[kv_at:kv_at + n * kv_row])
        offset, kv_at = offset + n * size, kv_at + n * kv_row
        commit = hop.commits.get(step)
        if commit is None or not commit_ok(hop.peer, commit):
            raise HopFailed(hop.peer, f"step {step}: {frames_problem(None, b'', b'', b'')}",
                            bad_data=True)
        if (commit.start_pos, commit.n) != (start_pos, n) or frames_problem(
                commit, raw_in, raw_out, raw_kv if with_kv else None):
            raise HopFailed(hop.peer, f"step {step}: frames unlike its commitment",
                            bad_data=True)
        try:
            x, y = (unpack_hidden(b, n, chain.hidden_size, chain.precision)[:rows]
                    for b in (raw_in, raw_out))
        except InvalidMessage as exc:
            raise HopFailed(hop.peer, str(exc), bad_data=True) from exc
        rows_kv = np.frombuffer(raw_kv, "<f4").reshape(n, kv_row // 4)[:rows]
        if not np.isfinite(rows_kv).all():
            raise HopFailed(hop.peer, f"step {step}: non-finite K/V", bad_data=True)
        out.append(_Logged(commit, start_pos, rows, x, y, rows_kv.astype(np.float32)))
        pos = start_pos + rows
    return out


def _bad_frames(chain: Chain, i: int, logged: list[_Logged]) -> tuple[StageCommit, str] | None:
    """A first hop's committed inputs must be the requester's own: (commit, why) if not."""
    if i:
        return None
    sent = chain.hops[0].inputs
    for e in logged:
        if not np.array_equal(
                e.inputs, sent[e.start_pos:e.start_pos + e.rows]):
            return e.commit, "committed to inputs the requester did not send"
    return None


async def _recompute(chain: Chain, hop: HopSession, x: np.ndarray) -> np.ndarray | None:
    """``hop``'s blocks over ``x`` (positions 0..) on another server, in a one-hop session."""
    return await on_checker(chain, hop, lambda s: chain._push(s, x, 0))
