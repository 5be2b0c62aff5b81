"""Stage-to-stage forwarding: who is to blame for a bad handoff.

Contract
--------
In a forwarded step the requester sends its hidden states to the first stage only; each stage
hands its output off to the next (``Handoff``, signed by the sender over
``messages.handoff_signing_bytes``) and the last one answers the requester. The requester never
sees the frames between stages, so a stage that receives a bad one reports it with the frame
as evidence (``HandoffRejected``), and the requester judges with :func:`judge_rejection`:

* a frame the sender signed that is malformed (a wrong byte count, non-finite values) or, at
  the step the requester is running, carries other positions than the step's, is the
  sender's fault: it is penalized;
* a well-formed frame of the running step is the reporter's fault (it refused good input),
  and so is evidence from a peer that is not the reporter's upstream: the reporter is
  penalized;
* a frame whose signature does not verify, or a well-formed frame of another step, proves
  nothing either way: both peers leave the chain, neither is penalized.

:func:`handoff_problem` is the receiving stage's check of a handoff before it computes (the byte
count, the positions it holds); the values themselves are checked by the driver when it
decodes them. The receiving stage does not verify the signature: the handoff came on a stream
that libp2p's secure channel (Noise) authenticates as its upstream's, so the stage already
knows who sent it. The signature is evidence for a third party, the requester, and
:func:`judge_rejection` verifies it there. Refusing an otherwise good frame for its signature
alone would gain nothing: the judge could only send both peers away unpenalized, and a
sender whose bad frame carries no valid signature leaves unpenalized either way.

Pure logic: no clock, no randomness; Ed25519 verification from crypto/.
"""

from __future__ import annotations

from dataclasses import dataclass

from crypto.keys import verify_signature
from crypto.peer_id import InvalidPeerId, public_key_from_peer_id
from protocol.errors import InvalidMessage
from protocol.inference.messages import (
    Handoff,
    HandoffRejected,
    Precision,
    check_hidden_size,
    handoff_signing_bytes,
)


@dataclass(frozen=True, slots=True)
class SendHandoff:
    """Sign and send this output to ``peer`` (the next hop of session ``from_session``)."""

    peer: str
    from_session: bytes
    session_id: bytes
    step: int
    start_pos: int
    n: int
    data: bytes


@dataclass(frozen=True, slots=True)
class HandoffFailed:
    """The driver could not send a session's handoff to its next hop."""

    session_id: bytes
    detail: str


@dataclass(frozen=True, slots=True)
class Blame:
    """The judge's verdict: ``peers`` leave the chain, penalized when ``penalize``."""

    peers: tuple[str, ...]
    penalize: bool
    detail: str


def signature_ok(sender: str, handoff: Handoff) -> bool:
    """True when ``handoff`` carries ``sender``'s valid signature."""
    try:
        key = public_key_from_peer_id(sender)
    except InvalidPeerId:
        return False
    signed = handoff_signing_bytes(handoff.session_id, handoff.step, handoff.start_pos,
                                   handoff.n, handoff.data)
    return verify_signature(key, signed, handoff.signature)


def handoff_problem(handoff: Handoff, *, hidden_size: int, precision: Precision,
                    cached: int) -> str:
    """Why the receiving stage refuses ``handoff`` ("" when it computes it); its signature is
    the judge's to check (see the module contract)."""
    try:
        check_hidden_size(handoff.data, handoff.n, hidden_size, precision)
    except InvalidMessage as exc:
        return str(exc)
    if handoff.start_pos > cached:
        return f"positions from {handoff.start_pos}, {cached} held"
    return ""


def judge_rejection(rejected: HandoffRejected, reporter: str, *, upstream: str, step: int,
                    start_pos: int, n: int, hidden_size: int, precision: Precision,
                    finite: bool) -> Blame:
    """Whose fault ``rejected`` is (see the module contract). ``upstream`` is the peer the
    requester linked to the reporter, ``step``, ``start_pos`` and ``n`` the step it is
    running, ``finite`` whether the evidence's values are all finite (the driver decodes)."""
    handoff = rejected.handoff
    if rejected.sender != upstream or handoff.session_id != rejected.session_id:
        return Blame((reporter,), True, "reported a handoff from a peer not its upstream")
    if not signature_ok(upstream, handoff):
        return Blame((upstream, reporter), False, "a reported handoff without a valid signature")
    try:
        check_hidden_size(handoff.data, handoff.n, hidden_size, precision)
    except InvalidMessage as exc:
        return Blame((upstream,), True, f"handed off {exc}")
    if not finite:
        return Blame((upstream,), True, "handed off non-finite hidden states")
    if handoff.step != step:
        return Blame((upstream, reporter), False, f"a reported handoff of step {handoff.step}, "
                                                  f"not {step}")
    if (handoff.start_pos, handoff.n) != (start_pos, n):
        return Blame((upstream,), True, f"handed off positions {handoff.start_pos}+"
                                        f"{handoff.n}, the "
                                        f"step sent {start_pos}+{n}")
    return Blame((reporter,), True, f"refused a well-formed handoff ({rejected.detail})"[:200])
