"""A stage's log of the steps it computed in one session: what it owes a check.

Contract
--------
A session's :class:`StageLog` keeps, for every step whose positions the stage's cache still
holds, the step's input frame and output frame exactly as they travelled and the K/V rows the
step appended to the cache (protocol.inference.recheck's layout): the bytes its
``StageCommit`` digests name. The K/V rows take as many bytes as the cache positions they
came from, so a session's log holds at most as much again as its cache reserved. A step that starts below the cached length (a rollback, a
speculative step after a rejection) first drops every logged step that starts at or after its
start; a step that straddles the new start stays (its rows past the start no longer count:
the requester truncates each step's rows at the next one's start). So the log never holds more
rows than the cache holds positions.

:meth:`StageLog.page` answers a ``StatesAsk``: the logged steps from the ``first``-th on that
cover positions below ``end_pos``, as many as fit one frame, with their K/V rows or without
(``StatesAsk.kv``); a step that alone does not fit (a long prefill: its K/V take a frame
sooner than its frames do) ends the pages there. Without K/V a requester can still check
by a recompute from position 0 (node.inference.stage_checks says when it does).

:class:`SendCommit` is the machine's effect after each step: the driver signs the commitment
(protocol.inference.stage_checks.commit_signing_bytes) and sends it to the session's opener,
before the step's result or handoff, on the opener's stream. Pure logic: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crypto.hashing import digest
from protocol.inference.messages import MAX_STATES_BYTES, StatesReply

#: bytes one logged step takes in a StatesReply's step table (three u64s)
STEP_ENTRY_BYTES = 24


@dataclass(frozen=True, slots=True)
class SendCommit:
    """Sign and send the opener ``peer`` a StageCommit of this step (digests of its frames
    and of its K/V rows)."""

    peer: str
    session_id: bytes
    step: int
    start_pos: int
    n: int
    input_digest: bytes
    output_digest: bytes
    kv_digest: bytes


@dataclass(frozen=True, slots=True)
class LoggedStep:
    step: int
    start_pos: int
    n: int
    inputs: bytes
    outputs: bytes
    kv: bytes

    def size(self, with_kv: bool) -> int:
        """The bytes this step takes in a StatesReply (with its K/V or without)."""
        kv = len(self.kv) if with_kv else 0
        return STEP_ENTRY_BYTES + len(self.inputs) + len(self.outputs) + kv


@dataclass(slots=True)
class StageLog:
    steps: list[LoggedStep] = field(default_factory=list)

    def crop(self, start_pos: int) -> None:
        """Forget the steps that start at or after ``start_pos`` (their positions are gone)."""
        self.steps = [s for s in self.steps if s.start_pos < start_pos]

    def add(self, peer: str, session_id: bytes, step: LoggedStep) -> SendCommit:
        """Log ``step`` (its start at or past every logged one's) and the commitment to send."""
        self.crop(step.start_pos)
        self.steps.append(step)
        return SendCommit(peer, session_id, step.step, step.start_pos, step.n,
                          digest(step.inputs), digest(step.outputs), digest(step.kv))

    def page(self, session_id: bytes, end_pos: int, first: int,
             with_kv: bool = True) -> StatesReply:
        due = [s for s in self.steps if s.start_pos < end_pos]
        table, inputs, outputs, kv = bytearray(), bytearray(), bytearray(), bytearray()
        size = 0
        for s in due[first:]:
            if size + s.size(with_kv) > MAX_STATES_BYTES:
                break  # the next page (or none: a step too large is left unchecked)
            size += s.size(with_kv)
            table += b"".join(v.to_bytes(8, "big") for v in (s.step, s.start_pos, s.n))
            inputs += s.inputs
            outputs += s.outputs
            kv += s.kv if with_kv else b""
        return StatesReply(session_id=session_id, first=first, total=len(due),
                           steps=bytes(table), inputs=bytes(inputs), outputs=bytes(outputs),
                           kv=bytes(kv))


def unpack_steps(table: bytes) -> list[tuple[int, int, int]]:
    """A StatesReply's step table as (step, start_pos, n) triples; ValueError when malformed."""
    if len(table) % STEP_ENTRY_BYTES:
        raise ValueError("a step table of whole 24-byte entries expected")
    return [tuple(int.from_bytes(table[i + k:i + k + 8], "big") for k in (0, 8, 16))  # type: ignore[misc]
            for i in range(0, len(table), STEP_ENTRY_BYTES)]
