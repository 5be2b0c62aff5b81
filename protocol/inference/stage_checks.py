"""Stage checks: the rules by which a requester catches a stage of its chain that computes
something other than its blocks (one copy, for the daemon and the simulator).

Contract
--------
* **Commitment.** After every step a stage sends its opener a ``StageCommit`` signed over
  :func:`commit_signing_bytes`: the session, the step, its positions and the digests of the
  input frame it computed on, of the output frame it produced and of the keys and values (K/V)
  the step appended to its attention cache (protocol.inference.recheck's layout). It keeps
  all three while its cache holds their positions (protocol.inference.stage_log) and sends
  them when asked.
* **Selection.** The requester draws a nonce per chain and fixes its hash in every
  ``SessionOpen`` (``check_nonce_hash``) before any stage commits. A step is checked when
  :func:`step_checked` says so: the task verifier's unsteerable draw
  (protocol.verification.rules: ``sampled(selection_seed(session, nonce, [commit hash]),
  stage, p)``). A stage cannot tell which of its steps will be checked (it never sees the
  nonce until the evidence is shown); the requester cannot steer the draw after seeing a
  commitment (its nonce's hash came first), so anyone given the nonce can recompute it.
* **Frames.** :func:`frames_problem` checks the frames and K/V a stage sends against its
  signed commitments; bytes that do not match what the stage signed are the stage's fault, as
  is a step it logged without committing to.
* **Inputs.** A stage after the first computed on its upstream's output: the input digest it
  committed to must equal the output digest its upstream committed to for the same step
  (:func:`inputs_agree`). When they differ one of the two signed a false digest, and these
  commitments alone cannot say which: both leave the chain, neither is convicted
  (protocol.inference.forwarding judges unprovable cases the same way).
* **Tolerance.** A checker that holds the same blocks recomputes each checked step alone: its
  committed input rows at their own positions, attending to the committed K/V of the positions
  before (protocol.inference.recheck: a step's output depends on earlier positions only
  through them). Both what the stage sent on (its output rows) and what it kept for later
  steps (its K/V rows) are compared with the recompute by relative L2 error,
  ``|y - y_ref| / |y_ref|``, worst row of either. Above
  :data:`MAX_STAGE_ERR` (:func:`disagrees`) the stage is convicted: a
  ``VERIFICATION_FAILED`` attestation (:func:`conviction`, the task verifier's path into the
  ledger), exclusion from the requester's chains, and the generation is run again without it.

Pure logic: no clock, no randomness of its own, Ed25519 from crypto/.
"""

from __future__ import annotations

from collections.abc import Mapping

from crypto.hashing import digest, digest_parts
from crypto.keys import verify_signature
from crypto.peer_id import InvalidPeerId, public_key_from_peer_id
from protocol.inference.messages import StageCommit
from protocol.ledger.events import Attest
from protocol.ledger.records import AttestationKind
from protocol.verification.rules import nonce_hash, sampled, selection_seed

#: the fraction of a stage's steps the requester checks (see the module contract)
DEFAULT_CHECK_RATE = 0.1
#: the worst relative L2 error of a checked row an honest stage stays under. Hidden states
#: travel as fp16, whose rounding moves a row by at most 2**-11 (4.9e-4) of its norm, and two
#: fp32 runs of the same blocks on the same inputs differ by about 1e-6; a stage whose weights
#: and activations pass through bfloat16 (2**-8 steps) moves its rows by several times this
#: bound, a coarser quantization, a skipped layer or a replayed step by far more. It holds
#: for stages computing in fp32 (a CPU stage); a CUDA stage computes in fp16 or bf16 and needs
#: a tolerance of its own, which needs its offer to say so (not yet).
MAX_STAGE_ERR = 1.5e-3
#: domain separation of a stage's commitment signature
COMMIT_DOMAIN = b"symphony/stage-commit/v2\0"


def commit_signing_bytes(session_id: bytes, step: int, start_pos: int, n: int,
                         input_digest: bytes, output_digest: bytes, kv_digest: bytes) -> bytes:
    """What a stage signs about one step (see the module contract)."""
    return b"".join([COMMIT_DOMAIN, session_id, step.to_bytes(8, "big"),
                     start_pos.to_bytes(8, "big"), n.to_bytes(8, "big"), input_digest,
                     output_digest, kv_digest])


def _signed(commit: StageCommit) -> bytes:
    return commit_signing_bytes(commit.session_id, commit.step, commit.start_pos, commit.n,
                                commit.input_digest, commit.output_digest, commit.kv_digest)


def commit_ok(stage: str, commit: StageCommit) -> bool:
    """True when ``commit`` carries ``stage``'s valid signature."""
    try:
        key = public_key_from_peer_id(stage)
    except InvalidPeerId:
        return False
    return verify_signature(key, _signed(commit), commit.signature)


def commit_hash(commit: StageCommit) -> bytes:
    return digest_parts([_signed(commit), commit.signature], person=b"symphony-scommit")


def check_nonce_hash(nonce: bytes) -> bytes:
    """What a SessionOpen carries of the requester's check nonce."""
    return nonce_hash(nonce)


def step_checked(nonce: bytes, stage: str, commit: StageCommit, rate: float) -> bool:
    """Is this committed step of ``stage`` checked? True with probability ``rate``."""
    seed = selection_seed(commit.session_id, nonce, [commit_hash(commit)])
    return sampled(seed, stage, rate)


def frames_problem(commit: StageCommit | None, inputs: bytes, outputs: bytes,
                   kv: bytes | None) -> str:
    """Why a logged step's frames and K/V (None: not sent) do not match the stage's
    commitment ("" when they do)."""
    if commit is None:
        return "sent a step it never committed to"
    for name, data, want in (("inputs", inputs, commit.input_digest),
                             ("outputs", outputs, commit.output_digest),
                             ("K/V", kv, commit.kv_digest)):
        if data is not None and digest(data) != want:
            return f"step {commit.step}: {name} differ from its commitment"
    return ""


def inputs_agree(commit: StageCommit, upstream: Mapping[int, StageCommit]) -> bool:
    """Does ``commit``'s input digest match its upstream's output of the same step (True when
    the upstream committed to no such step: the requester sent those inputs itself)?"""
    theirs = upstream.get(commit.step)
    return theirs is None or theirs.output_digest == commit.input_digest


def disagrees(err: float) -> bool:
    """Is a checked step's worst relative row error beyond an honest stage's?"""
    return not err <= MAX_STAGE_ERR  # a NaN error disagrees too


def conviction(stage: str, commit: StageCommit, nonce: bytes, detail: str) -> Attest:
    """The ledger attestation against ``stage`` for the step ``commit`` it got wrong
    (``detail``: how); its evidence hash names the signed commitment and the nonce that
    selected it."""
    evidence = digest_parts([commit_hash(commit), nonce], person=b"symphony-sevid")
    return Attest(subject=stage, object_id=commit.session_id,
                  kind=AttestationKind.VERIFICATION_FAILED,
                  outcome=f"stage step {commit.step}: {detail}"[:128], evidence_hash=evidence)


def error_detail(err: float) -> str:
    return f"states off by {err:.3g} (> {MAX_STAGE_ERR:g})"
