"""When a requester opens its next bid round: at once, after a backoff, skipped, or never.

A pure rule (no clock, no I/O: times are passed in) that protocol/market/auction.py applies
each time a task still needs executors and no bid window is open, so the daemon's requester
and the simulator's decide alike. :func:`next_round` promises:

* after a round that brought bids (an executor then failed, refused or timed out, or too few
  bid): the next round opens at once, so a replan after a failed executor stays fast;
* after a round in which nobody bid: the next one opens after a backoff,
  ``backoff_base_ms`` doubled for each bidless round in a row, at most ``backoff_max_ms``:
  the executors are busy (or absent), and asking again at once only repeats the question
  while they work. Bidless rounds do not count toward ``max_rounds``; the task's deadline
  bounds them, so a task keeps asking, ever more slowly, while its deadline leaves time;
* when the ledger shows no untried executor that could serve the task (``untried`` is 0):
  if executors were tried already, nobody is left and the task gives up now; if none was
  ever known, the round is skipped (no beacon: nobody could answer it) and counted as a
  bidless round, and the question is asked again after the backoff, when a record may
  have arrived. ``untried`` None means no ledger: every round is held;
* it gives up when ``max_rounds`` rounds with bids were held, or when the next round would
  start with less than ``min_round_ms`` of the deadline left.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RoundAction(Enum):
    BEACON = "beacon"  # open a round (beacon) at ``at_ms``
    SKIP = "skip"  # hold no round now; ask again at ``at_ms``
    GIVE_UP = "give_up"  # no round can bring an executor: ``why`` says why


@dataclass(frozen=True, slots=True)
class NextRound:
    action: RoundAction
    at_ms: int = 0
    #: for GIVE_UP: the task's failure reason when no attempt is left running
    why: str = ""
    #: bidless rounds in a row once this decision is taken (a skip counts as one)
    empty_rounds: int = 0


@dataclass(frozen=True, slots=True)
class RoundState:
    """What the rule needs to know of a task."""

    now_ms: int
    deadline_at_ms: int
    #: when the last round closed or was skipped (the backoff counts from there)
    last_round_at_ms: int
    #: rounds held so far that brought at least one bid
    rounds_with_bids: int
    #: rounds in a row, up to now, in which nobody bid (or that were skipped)
    empty_rounds: int
    #: executors tried for the task already
    tried: int
    #: executors the ledger shows that could serve the task and were not tried (None: no
    #: ledger to ask)
    untried: int | None


def backoff_ms(empty_rounds: int, base_ms: int, max_ms: int) -> int:
    """The wait before a round that follows ``empty_rounds`` bidless rounds in a row."""
    if empty_rounds <= 0:
        return 0
    return min(max_ms, base_ms << min(empty_rounds - 1, 30))


def next_round(state: RoundState, *, max_rounds: int, min_round_ms: int, backoff_base_ms: int,
               backoff_max_ms: int) -> NextRound:
    """The rule of the module doc."""
    s = state
    none_bid = f"no executor left: none bid in {s.rounds_with_bids + s.empty_rounds} rounds " \
               "(all busy or none serves the model)"
    if s.rounds_with_bids >= max_rounds:
        return NextRound(RoundAction.GIVE_UP, why="no executor left", empty_rounds=s.empty_rounds)
    if s.untried == 0 and s.tried:
        return NextRound(RoundAction.GIVE_UP, why="no executor left: every executor the ledger "
                         "shows for the model was tried", empty_rounds=s.empty_rounds)
    empty = s.empty_rounds + 1 if s.untried == 0 else s.empty_rounds
    at = max(s.now_ms, s.last_round_at_ms + backoff_ms(empty, backoff_base_ms, backoff_max_ms))
    if s.deadline_at_ms - at < min_round_ms:
        return NextRound(RoundAction.GIVE_UP, why="no executor left" if s.tried else none_bid,
                         empty_rounds=s.empty_rounds)
    if s.untried == 0:
        return NextRound(RoundAction.SKIP, at, empty_rounds=empty)
    return NextRound(RoundAction.BEACON, at, empty_rounds=empty)
