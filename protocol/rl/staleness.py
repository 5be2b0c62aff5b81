"""Bounded staleness: which rollouts a learner may still train on.

A rollout generated with policy version ``v`` is accepted while the learner trains version
``w`` if and only if ``0 <= w - v <= S``. ``S = 0`` is synchronous training: only rollouts of
the version being trained count, so the learner waits for them. A rollout from a version the
learner has not published yet (``v > w``) is never accepted: no honest worker can hold it.

The rule is pure and total over its documented domain; a negative ``S`` or version is our own
misuse (``LocalProtocolError``), never a peer's fault.
"""

from __future__ import annotations

from protocol.errors import LocalProtocolError

#: the largest staleness bound a learner may be configured with (prime-rl's off-policy limit
#: is 8 steps; past a few dozen the importance ratios mask nearly every token)
MAX_STALENESS = 64


def check_bound(max_staleness: int) -> int:
    """``max_staleness`` itself when it is a valid bound S, else ``LocalProtocolError``."""
    if type(max_staleness) is not int or not 0 <= max_staleness <= MAX_STALENESS:
        raise LocalProtocolError(
            f"staleness bound S={max_staleness!r} is not an int in [0, {MAX_STALENESS}]")
    return max_staleness


def lag(version: int, training: int) -> int:
    """How many versions a rollout of ``version`` is behind the version being trained."""
    if version < 0 or training < 0:
        raise LocalProtocolError(f"versions are >= 0 (got v={version}, w={training})")
    return training - version


def accepts(version: int, training: int, max_staleness: int) -> bool:
    """True iff a rollout of ``version`` may be used while training ``training``:
    ``0 <= training - version <= max_staleness``."""
    behind = lag(version, training)
    return 0 <= behind <= check_bound(max_staleness)


def oldest_accepted(training: int, max_staleness: int) -> int:
    """The oldest version still accepted while training ``training`` (workers may drop older
    adapters, and jobs for older versions are not worth issuing)."""
    return max(0, training - check_bound(max_staleness))
