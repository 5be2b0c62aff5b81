"""The next-round rule (protocol/market/rounds.py), case by case."""

from __future__ import annotations

import pytest

from protocol.market.rounds import RoundAction, RoundState, backoff_ms, next_round

RULE = {"max_rounds": 4, "min_round_ms": 1_000, "backoff_base_ms": 1_000,
        "backoff_max_ms": 8_000}


def state(**kw: object) -> RoundState:
    fields: dict[str, object] = {"now_ms": 10_000, "deadline_at_ms": 60_000,
                                 "last_round_at_ms": 10_000, "rounds_with_bids": 1,
                                 "empty_rounds": 0, "tried": 1, "untried": 2}
    fields.update(kw)
    return RoundState(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "action", "at_ms", "empty"), [
    ({}, RoundAction.BEACON, 10_000, 0),  # after a round with bids: at once
    ({"untried": None}, RoundAction.BEACON, 10_000, 0),  # no ledger: as before
    ({"empty_rounds": 1, "rounds_with_bids": 0, "tried": 0}, RoundAction.BEACON, 11_000, 1),
    ({"empty_rounds": 3, "rounds_with_bids": 0, "tried": 0}, RoundAction.BEACON, 14_000, 3),
    ({"empty_rounds": 9, "rounds_with_bids": 0, "tried": 0}, RoundAction.BEACON, 18_000, 9),
    # a wait that has already run (the tick after a skip) is not waited again
    ({"empty_rounds": 2, "tried": 0, "now_ms": 12_000}, RoundAction.BEACON, 12_000, 2),
    ({"untried": 0, "tried": 0}, RoundAction.SKIP, 11_000, 1),  # nobody known yet
    ({"untried": 0, "tried": 0, "empty_rounds": 2}, RoundAction.SKIP, 14_000, 3),
    ({"untried": 0}, RoundAction.GIVE_UP, 0, 0),  # all tried
    ({"rounds_with_bids": 4}, RoundAction.GIVE_UP, 0, 0),
    # bidless rounds do not count toward max_rounds; the deadline ends them
    ({"rounds_with_bids": 3, "empty_rounds": 20}, RoundAction.BEACON, 18_000, 20),
    ({"empty_rounds": 3, "deadline_at_ms": 14_999}, RoundAction.GIVE_UP, 0, 3),
])
def test_next_round(kw: dict[str, object], action: RoundAction, at_ms: int,
                    empty: int) -> None:
    plan = next_round(state(**kw), **RULE)
    assert plan.action is action
    assert plan.empty_rounds == empty
    if action is not RoundAction.GIVE_UP:
        assert plan.at_ms == at_ms
    else:
        assert plan.why.startswith("no executor left")


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_ms(n, 1_000, 8_000) for n in range(6)] == \
        [0, 1_000, 2_000, 4_000, 8_000, 8_000]
    assert backoff_ms(10_000, 1_000, 8_000) == 8_000  # no overflow for a long streak
