"""Which attestation a rollout job's outcome yields for its worker.

The same pattern as the task market (protocol/market/attestations.py): the learner's job book
returns a market ``Attest`` effect (subject, job id, outcome, detail) with ``kind``
:data:`ROLLOUT_ATTEST`; the driver hands it to ``protocol.market.attestations.
ledger_attestation``, which maps ``completed`` to ``TASK_COMPLETED``, ``timeout`` to
``TASK_TIMED_OUT`` and ``wrong`` (a group that failed validation) to ``TASK_FAILED``. A stale
group is nobody's fault (the learner moved on) and yields no attestation.
"""

from __future__ import annotations

from protocol.market.events import COMPLETED, TIMEOUT, WRONG, Attest

#: ``Attest.kind`` for rollout outcomes
ROLLOUT_ATTEST = "rollout"


def accepted(worker: str, job_id: bytes) -> Attest:
    return Attest(subject=worker, task_id=job_id, kind=ROLLOUT_ATTEST, outcome=COMPLETED)


def invalid(worker: str, job_id: bytes, reason: str) -> Attest:
    """The group failed validation: ``reason`` (from protocol/rl/validation.py) is the detail."""
    return Attest(subject=worker, task_id=job_id, kind=ROLLOUT_ATTEST, outcome=WRONG,
                  detail=f"rollout: {reason}")


def timed_out(worker: str, job_id: bytes) -> Attest:
    return Attest(subject=worker, task_id=job_id, kind=ROLLOUT_ATTEST, outcome=TIMEOUT,
                  detail="rollout: no result by the deadline")
