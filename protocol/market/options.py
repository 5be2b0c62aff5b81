"""What a requester's auction reads from outside the machine: one record, ``AuctionOptions``.

The auction never reads the ledger or the node. Everything it asks of them is a callback in
this record, passed whole to every requester machine (``Auction``, ``VerifiedAuction``, the
planning requester's auction) by the daemon (node/market/requester.py through
node/verification/service.py) and by the simulator (simulations/machines/market.py,
simulations/machines/verification.py, simulations/agents/plan_world.py). One record means an
option added here reaches every machine the same way, or fails to type-check where a caller
builds one without it: none can be set afterwards by attribute, nor left out by one driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.agents.wire import AgentMatch, no_cards
from protocol.market.state import OpenTask
from protocol.market.voting import VoteRule


def neutral_reputation(peer: str) -> float:
    """Every peer's reputation when no ledger is known: the neutral 0.5."""
    return 0.5


def unknown_bidders(task: OpenTask) -> int | None:
    """How many peers could bid when no ledger is known: unknown, so no early close on it."""
    return None


def nobody_excluded(peer: str, now: int) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class AuctionOptions:
    """The requester's callbacks into its node, each with the default of a node that knows no
    ledger."""

    #: a peer's reputation in [0, 1] (the selector's score and the ballot's weight)
    reputation: Callable[[str], float] = neutral_reputation
    #: how many peers could bid on a task (the ledger's live peers serving a matching model,
    #: the requester itself only when the task allows it; None: not known): the bid window
    #: closes early once all of them have bid (protocol/market/bidding.py)
    possible_bidders: Callable[[OpenTask], int | None] = unknown_bidders
    #: ``excluded(peer, now)``: never pick this peer's bids (the verification's convicted peers)
    excluded: Callable[[str, int], bool] = nobody_excluded
    #: the vote's rule (protocol/market/voting.py; the protocol's by default)
    voting: VoteRule = field(default_factory=VoteRule)
    #: ``agent_match(peer, agent, requirement)``: the match of ``peer``'s card for ``agent`` to
    #: a task's need, from our ledger (protocol.agents.wire.agent_matcher; None: no such card,
    #: the bid is refused)
    agent_match: AgentMatch = no_cards
