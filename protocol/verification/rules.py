"""Pure rules of verification: commitments, the unsteerable seed, sampling, ranking, escalation.

Everything here is a deterministic function of signed or revealed data, so any node holding
the commitments of a commit window and the requester's revealed nonce recomputes the same
choices (which results are checked, which chunks, which verifiers in which order).

Seed
----
``seed = H(task_id, nonce, sorted content hashes of the window's commitments)``. The requester
fixed ``H(nonce)`` in its signed ``Terms`` before any executor committed, and every commitment
names that hash; the executors' commitments are salted and fixed before the nonce is revealed.
So neither side can steer the seed: the requester cannot pick a nonce after seeing the
commitments, an executor cannot grind its salt against a nonce it has not seen.

Draws from the seed (each a separate, personalised hash):
* ``sampled(seed, executor, p)``: the result is checked with probability ``p``;
* ``choose_chunks(seed, executor, count, n)``: ``n`` distinct chunk indices;
* ``rank_verifiers(seed, candidates, exclude)``: the candidates ordered by ``H(seed, peer)``;
  the first ones check, later ones are the escalation panels and replacements.

Escalation rule (:func:`decide`)
--------------------------------
Round 0 asks the first ``verifiers`` of the ranking. If their verdicts agree, that is the
decision. If they disagree, the result is *disputed* and the next ``panel`` verifiers of the
ranking re-check the same chunks (round 1); a unanimous panel decides; a split panel escalates
again, up to ``max_escalations`` rounds, after which the result is *undecided*: it is kept out
of the vote (an unverifiable result is not trusted) but nobody is attested for it. Every
verifier whose verdict differs from a decision is attested ``VERDICT_CONTRADICTED``.

Consequence: one honest verifier among the first ones suffices to take a cheater's result out
of the vote, unless an entire fresh random panel (drawn after the fact from the same seed)
passes it; with a fraction ``q`` of lazy or colluding verifiers that happens with probability
about ``q ** panel``. Symmetrically, one lying verifier cannot convict an honest executor
unless a whole panel lies with it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

from crypto.hashing import digest, digest_parts
from crypto.merkle import ProofStep
from protocol.agents.wire import ToolCallRecord
from protocol.codec import encode
from protocol.ledger.records import AttestationKind
from protocol.ledger.reputation import NEUTRAL
from protocol.ledger.view import LedgerView
from protocol.market.messages import HASH_LEN, ResultBody, TaskSpec
from protocol.verification.messages import (
    ID_BYTES,
    PROOF_STEP_BYTES,
    STATES_BUSY,
    STATES_EVICTED,
    STATES_NOT_HELD,
    CheckBody,
)
from protocol.verification.state import VerifyConfig

_U32 = 1 << 32


def pack_ids(ids: Iterable[int]) -> bytes:
    """Token ids as big-endian u32s; raises ValueError for an id outside [0, 2**32)."""
    out = bytearray()
    for i in ids:
        if not 0 <= i < _U32:
            raise ValueError(f"token id {i} is not a u32")
        out += i.to_bytes(ID_BYTES, "big")
    return bytes(out)


def unpack_ids(data: bytes) -> tuple[int, ...]:
    if len(data) % ID_BYTES:
        raise ValueError("packed token ids must be whole u32s")
    return tuple(int.from_bytes(data[i:i + ID_BYTES], "big")
                 for i in range(0, len(data), ID_BYTES))


def spec_hash(task: TaskSpec) -> bytes:
    """Hash of the canonical encoding of the task an executor answered."""
    return digest(encode(task), person=b"symphony-vspec")


def nonce_hash(nonce: bytes) -> bytes:
    return digest(nonce, person=b"symphony-vnonce")


def result_commitment(task_id: bytes, attempt: int, executor: str, answer: str, cot: str,
                      output_ids: bytes, salt: bytes, context: bytes = b"") -> bytes:
    """What an executor commits to: its answer, CoT and output tokens, salted, and for an
    agent's result the ``context`` (:func:`agent_context`) its model read besides the task."""
    parts = [task_id, attempt.to_bytes(8, "big"), executor.encode(), answer.encode(),
             cot.encode(), output_ids, salt]
    return digest_parts([*parts, context] if context else parts, person=b"symphony-vcommit")


def agent_context(system_prompt: str, tool_calls: Sequence[ToolCallRecord],
                  adapter: bytes = b"") -> bytes:
    """The hash of an agent's system prompt, tool calls and LoRA adapter (its content hash)
    as its result carries them (b"" when it has none of them: a result as before agents
    commits as it did; an adapter only adds a part, so one without commits as before)."""
    if not system_prompt and not tool_calls and not adapter:
        return b""
    parts = [system_prompt.encode(), *(encode(c) for c in tool_calls)]
    return digest_parts([*parts, b"adapter", adapter] if adapter else parts,
                        person=b"symphony-vagent")


def output_commitment(task_id: bytes, attempt: int, executor: str, output: ResultBody | CheckBody,
                      output_ids: bytes, salt: bytes) -> bytes:
    """:func:`result_commitment` of ``output`` (a result, or a check request's copy of it): the
    one way the executor makes it and the requester and verifiers check it."""
    return result_commitment(task_id, attempt, executor, output.answer, output.cot, output_ids,
                             salt, agent_context(output.system_prompt, output.tool_calls,
                                                 output.adapter))


def reveals_with_commit(k: int) -> bool:
    """Whether the executor of a task with ``k`` executors sends its ``Reveal`` right behind
    its ``Commit`` (the requester then sends no ``RevealRequest``). Waiting to be asked keeps
    an executor from revealing before every executor of its window has committed, so nobody
    can copy a revealed answer; a k=1 task runs one attempt at a time, whose commitment closes
    its window at once, so there is nobody to copy from, and the seed stays unsteerable (the
    executor committed without knowing the nonce, which it now never learns). It saves the
    round trip of the request on every k=1 answer."""
    return k == 1


def selection_seed(task_id: bytes, nonce: bytes, commit_hashes: Iterable[bytes]) -> bytes:
    return digest_parts([task_id, nonce, *sorted(commit_hashes)], person=b"symphony-vseed")


def _draw(seed: bytes, *parts: bytes) -> bytes:
    return digest_parts([seed, *parts], person=b"symphony-vdraw")


def unit(seed: bytes, *parts: bytes) -> float:
    """A number in [0, 1) drawn from ``seed`` and ``parts``."""
    return int.from_bytes(_draw(seed, *parts)[:8], "big") / float(1 << 64)


def sampled(seed: bytes, executor: str, p: float) -> bool:
    """Is ``executor``'s result in this window checked? True with probability ``p``."""
    return unit(seed, b"sample", executor.encode()) < p


def choose_chunks(seed: bytes, executor: str, count: int, n: int) -> tuple[int, ...]:
    """``min(n, count)`` distinct chunk indices in [0, count), ascending."""
    ranked = sorted(range(count),
                    key=lambda i: _draw(seed, b"chunk", executor.encode(), i.to_bytes(4, "big")))
    return tuple(sorted(ranked[:max(0, min(n, count))]))


def choose_layers(seed: bytes, executor: str, layers: int, n: int) -> tuple[int, ...]:
    """``min(n, layers - 1)`` distinct decoder layers in [2, layers] (1-based), ascending: the
    layers a check re-runs besides layer 1 (models.layer_states)."""
    ranked = sorted(range(2, layers + 1),
                    key=lambda i: _draw(seed, b"layer", executor.encode(), i.to_bytes(4, "big")))
    return tuple(sorted(ranked[:max(0, n)]))


def rank_verifiers(seed: bytes, candidates: Iterable[str], exclude: Iterable[str]) -> list[str]:
    """Candidate verifiers (minus ``exclude``) in the seed's order."""
    skip = set(exclude)
    pool = sorted({c for c in candidates if c not in skip})
    return sorted(pool, key=lambda c: (_draw(seed, b"rank", c.encode()), c))


def check_id(task_id: bytes, attempt: int, verifier: str, round_: int) -> bytes:
    return digest_parts([task_id, attempt.to_bytes(8, "big"), verifier.encode(),
                         round_.to_bytes(2, "big")], person=b"symphony-vcheck")


def evidence_hash(commit_hash: bytes, seed: bytes, chunk_indices: Sequence[int],
                  output_ids: bytes) -> bytes:
    """Names what a check covered: every verifier of one result computes the same hash."""
    return digest_parts([commit_hash, seed, b"".join(i.to_bytes(4, "big") for i in chunk_indices),
                         digest(output_ids)], person=b"symphony-vevid")


def reveal_evidence(commit_hash: bytes, result_hash: bytes, salt: bytes,
                    output_ids: bytes) -> bytes:
    """Evidence for a reveal that does not match its commitment."""
    return digest_parts([commit_hash, result_hash, salt, digest(output_ids)],
                        person=b"symphony-vrevl")


def encode_proof(steps: Sequence[ProofStep]) -> bytes:
    return b"".join((b"\x01" if s.sibling_is_left else b"\x00") + s.sibling for s in steps)


def decode_proof(data: bytes) -> list[ProofStep]:
    """Raises ValueError for anything that is not whole 33-byte steps with a 0/1 flag."""
    if len(data) % PROOF_STEP_BYTES:
        raise ValueError("a proof is whole 33-byte steps")
    steps = []
    for i in range(0, len(data), PROOF_STEP_BYTES):
        flag, sibling = data[i], data[i + 1:i + PROOF_STEP_BYTES]
        if flag not in (0, 1) or len(sibling) != HASH_LEN:
            raise ValueError("a proof step is a 0/1 flag and a 32-byte hash")
        steps.append(ProofStep(sibling, sibling_is_left=flag == 1))
    return steps


class Decision(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    #: the verdicts disagree: ask the next panel
    ESCALATE = "escalate"
    #: still split after the last escalation: kept out of the vote, nobody attested
    UNDECIDED = "undecided"


def decide(rounds: Sequence[Mapping[str, bool]], max_escalations: int) -> Decision:
    """Apply the escalation rule (see the module docstring) to the verdicts so far.

    ``rounds[r]`` maps each verifier of round ``r`` to its verdict (True = pass); only the
    last round is judged, earlier rounds are why it exists. An empty last round (nobody
    could check) is UNDECIDED.
    """
    if not rounds or not rounds[-1]:
        return Decision.UNDECIDED
    verdicts = set(rounds[-1].values())
    if verdicts == {True}:
        return Decision.PASS
    if verdicts == {False}:
        return Decision.FAIL
    return Decision.ESCALATE if len(rounds) - 1 < max_escalations else Decision.UNDECIDED


#: distinct, reputable observers whose VERIFICATION_FAILED attestations exclude a peer
#: network-wide (see :func:`ledger_convicted`)
MIN_CONVICTING_OBSERVERS = 2


def ledger_convicted(view: LedgerView, peer: str, now: int, window_ms: int,
                     min_observers: int = MIN_CONVICTING_OBSERVERS) -> bool:
    """Does the ledger show ``peer`` failing verification recently, on good authority?

    True when, within the last ``window_ms``, at least ``min_observers`` distinct observers
    attested ``VERIFICATION_FAILED`` about ``peer`` and each of them has a reputation above
    the neutral prior (others vouch for its work). One conviction gives two such attestations
    (a verifier's verdict and the requester's decision), so a cheater caught by one requester
    is excluded by every requester that reads the ledger; a single party, or fresh identities
    nobody vouches for, cannot ban an honest peer with made-up failures. (The requester that
    saw the failure excludes the peer at once, on its own evidence.)
    """
    epoch = now + view.clock_offset_ms
    observers = {
        held.observer
        for held in view.attestations(subject=peer, kind=AttestationKind.VERIFICATION_FAILED)
        if epoch - window_ms <= held.attestation.observed_at_ms <= epoch + window_ms
        and held.observer != peer
    }
    if len(observers) < min_observers:
        return False
    reputable = [o for o in observers if view.reputation(o, now).score > NEUTRAL.score]
    return len(reputable) >= min_observers


def states_refusal_convicts(index: int) -> bool:
    """Does an executor's refusal to open its committed layer states fail the check?

    Only ``STATES_NOT_HELD``: it committed to states it does not have. ``STATES_EVICTED``
    (dropped once past the check window, which an honest executor's store covers, so it never
    happens to an honest one in time) and ``STATES_BUSY`` (the verifier is over the
    executor's quota) make the check inconclusive: the verifier declines it, never convicts.
    """
    if index not in (STATES_NOT_HELD, STATES_EVICTED, STATES_BUSY):
        raise ValueError(f"{index} is not a states refusal")
    return index == STATES_NOT_HELD


def states_check_window_ms(config: VerifyConfig) -> int:
    """How long after committing an executor may be asked for its layer states: the commit
    window, the reveal, then up to ``1 + max_escalations`` rounds of checks, in each of which
    every verifier may time out once and be replaced. An executor keeps its states at least
    this long (models/state_store.py)."""
    rounds = 1 + config.max_escalations
    return config.commit_window_ms + config.reveal_ms + rounds * 2 * config.check_timeout_ms
