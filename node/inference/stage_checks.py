"""The requester's stage checks over a finished chain (rules: protocol/inference/stage_checks.py).

:func:`check_chain` runs after a generation, before the chain's sessions close. For each hop
(this node's own stage aside) it takes the hop's signed commitments (node.inference.hops keeps
them), selects the checked steps by the unsteerable draw, and when any is selected:

1. asks the hop for its logged steps up to the last selected one (``StatesAsk``, page by
   page) and checks every frame against the step's signed commitment, the first hop's inputs
   against what the requester sent, and every other hop's input digests against its
   upstream's output digests;
2. has the hop's blocks recomputed on those inputs from position 0 by another server whose
   offer covers them, this node's own stage included (a one-hop session of its own, ranked
   from the nonce so the stage cannot choose its checker), in one prefill;
3. compares each selected step's rows; beyond the tolerance the hop is convicted.

A batch at the end costs one prefill per checked hop, the cheapest way to recompute many
positions; the generation's output is then the honest chain's only if nothing was convicted,
so the requester (node.inference.requester) runs it again without the convicted stages.
A hop with selected steps and no server able to recompute it is reported ``unchecked``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from crypto.hashing import digest
from node.inference.chain import Chain
from node.inference.hops import HopFailed, HopSession
from node.inference.wire import unpack_hidden
from protocol.errors import InvalidMessage
from protocol.inference.messages import StageCommit, StatesAsk, StatesReply
from protocol.inference.routing import Hop
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
from protocol.verification.rules import rank_verifiers


@dataclass
class CheckReport:
    #: hops whose selected steps were recomputed, and how many steps that covered
    checked: list[str] = field(default_factory=list)
    steps_checked: int = 0
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
    logged = await _fetch(chain, hop, end_pos)
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
    checks = [e for e in logged if e.commit.step in selected]
    if not checks:
        return
    reference = await _recompute(chain, hop, np.concatenate([e.inputs for e in logged]))
    if reference is None:
        report.unchecked.append(hop.peer)
        return
    report.checked.append(hop.peer)
    report.steps_checked += len(checks)
    for e in checks:
        ref = reference[e.start_pos:e.start_pos + e.rows]
        err = float(np.max(np.linalg.norm(e.outputs - ref, axis=1)
                           / np.maximum(np.linalg.norm(ref, axis=1), 1e-12)))
        if disagrees(err):
            report.convicted.append(conviction(hop.peer, e.commit, chain.nonce,
                                               error_detail(err)))
            return


async def _fetch(chain: Chain, hop: HopSession, end_pos: int) -> list[_Logged] | None:
    """The hop's logged steps below ``end_pos``, rows cut where the next step starts; None
    when a step is too large to send. Malformed pages are the hop's fault (HopFailed)."""
    table: list[tuple[int, int, int]] = []
    inputs, outputs = bytearray(), bytearray()
    total = None
    while total is None or len(table) < total:
        await chain._send(hop, StatesAsk(session_id=hop.session_id, end_pos=end_pos,
                                         first=len(table)))
        page = await chain._expect(hop, (StatesReply,))
        assert isinstance(page, StatesReply)
        try:
            entries = unpack_steps(page.steps)
        except ValueError as exc:
            raise HopFailed(hop.peer, str(exc), bad_data=True) from exc
        if page.first != len(table) or (total is not None and page.total != total):
            raise HopFailed(hop.peer, "a states page out of order", bad_data=True)
        if not entries:
            return None if page.total > len(table) else _cut(chain, hop, table, inputs,
                                                              outputs, end_pos)
        total = page.total
        table += entries
        inputs += page.inputs
        outputs += page.outputs
    return _cut(chain, hop, table, inputs, outputs, end_pos)


def _cut(chain: Chain, hop: HopSession, table: list[tuple[int, int, int]], inputs: bytes,
         outputs: bytes, end_pos: int) -> list[_Logged]:
    size = chain.hidden_size * chain.precision.itemsize
    if sum(n for _, _, n in table) * size != len(inputs) or len(inputs) != len(outputs):
        raise HopFailed(hop.peer, "states pages of the wrong size", bad_data=True)
    out, offset, pos = [], 0, 0
    for k, (step, start_pos, n) in enumerate(table):
        if start_pos != pos:
            raise HopFailed(hop.peer, f"logged steps leave a gap at {pos}", bad_data=True)
        nxt = table[k + 1][1] if k + 1 < len(table) else end_pos
        rows = max(0, min(n, nxt - start_pos))
        raw_in, raw_out = (bytes(b[offset:offset + n * size]) for b in (inputs, outputs))
        offset += n * size
        commit = hop.commits.get(step)
        if commit is None or not commit_ok(hop.peer, commit):
            raise HopFailed(hop.peer, f"step {step}: {frames_problem(None, b'', b'')}",
                            bad_data=True)
        if (commit.start_pos, commit.n) != (start_pos, n) or frames_problem(commit, raw_in,
                                                                              raw_out):
            raise HopFailed(hop.peer, f"step {step}: frames unlike its commitment",
                            bad_data=True)
        try:
            x, y = (unpack_hidden(b, n, chain.hidden_size, chain.precision)[:rows]
                    for b in (raw_in, raw_out))
        except InvalidMessage as exc:
            raise HopFailed(hop.peer, str(exc), bad_data=True) from exc
        out.append(_Logged(commit, start_pos, rows, x, y))
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
            return await chain._push(session, x, 0)
        except HopFailed as exc:
            await chain._fail(exc)
        finally:
            await chain._close_hop(session)
    return None
