"""Which ledger attestation a task's outcome yields: the one mapping daemon and simulator share.

The ``Auction`` returns a market ``Attest`` (subject, task id, outcome, detail) for every
executor whose work on a task it judged; the driver turns it into a ledger
``protocol.ledger.events.Attest`` with :func:`ledger_attestation` and hands that to its
ledger machine. Promises:

* ``completed`` becomes ``TASK_COMPLETED``, ``timeout`` ``TASK_TIMED_OUT``, ``wrong`` and
  every other outcome (``failed``, anything a later auction adds) ``TASK_FAILED``: an unknown
  outcome never counts in the executor's favour;
* the attestation's ``outcome`` text is ``"<outcome>: <detail>"`` (the outcome alone when
  there is no detail), cut to :data:`MAX_OUTCOME_CHARS` so it always fits the record.
"""

from __future__ import annotations

from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind
from protocol.market.events import COMPLETED, TIMEOUT, WRONG, Attest

#: task outcome -> ledger attestation kind; outcomes not listed are TASK_FAILED
LEDGER_KINDS: dict[str, AttestationKind] = {
    COMPLETED: AttestationKind.TASK_COMPLETED,
    WRONG: AttestationKind.TASK_FAILED,
    TIMEOUT: AttestationKind.TASK_TIMED_OUT,
}
#: the ledger keeps this much of an outcome's text
MAX_OUTCOME_CHARS = 128


def ledger_attestation(effect: Attest) -> LedgerAttest:
    """The ledger attestation the market's ``Attest`` effect stands for."""
    kind = LEDGER_KINDS.get(effect.outcome, AttestationKind.TASK_FAILED)
    outcome = f"{effect.outcome}: {effect.detail}" if effect.detail else effect.outcome
    return LedgerAttest(subject=effect.subject, object_id=effect.task_id, kind=kind,
                        outcome=outcome[:MAX_OUTCOME_CHARS])
