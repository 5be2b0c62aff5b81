"""Agents in the task market: the wire pieces and rules the requester, the bidder and the
verifier share.

Contract
--------
* :class:`ToolCallRecord` (tag 183) is one tool call an agent made while it answered: the
  tool's name, its arguments as canonical JSON text (:func:`canonical_arguments`) and its
  output (or error) text, each bounded; a ``ResultBody`` carries at most ``MAX_TOOL_CALLS``.
* A task's need (``Requirement.needs``, ``skills``, ``agent``, the requester's quantized
  embedding of ``needs`` and its embedder's hash) is checked by :func:`check_need`; the
  vector is restored by :func:`need_vector`.
* :func:`card_match` is the one match of an agent card to a task's need, the requester's and
  the bidder's alike (protocol.agents.matching.match_score over the card's own vector and
  skills): the requester calls it with the card its ledger holds for the bidder, never with
  the bidder's claim. None means "no such card".
* :func:`tool_transcript` is the text of an agent's tool calls as its model reads it before
  the final answer, and :func:`restated_answer` the rule that makes the answer the last
  call's short output when the model's own answer does not state it. The executor
  (models/cot.py, and its tool loop node/agents/loop.py) and every verifier
  (models/checks.py) apply both, so the text the model
  read and the answer it gave are rebuilt exactly from the task and the signed result.

The standard library, crypto/ and the codec only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.agents.cards import (
    MAX_AGENT_NAME_LEN,
    MAX_EMBEDDING_DIM,
    MAX_SKILL_LEN,
    MAX_SKILLS,
    MAX_TOOL_NAME_LEN,
    NAME_PATTERN,
    SKILL_PATTERN,
    AgentCard,
    AgentCards,
)
from protocol.agents.matching import dequantize, match_score
from protocol.codec import Message, limits, message

#: characters of a task's need text
MAX_NEEDS_CHARS = 512
#: skill tags a task may ask for
MAX_NEED_SKILLS = MAX_SKILLS
#: tool calls a result may carry, and the size of each part of one
MAX_TOOL_CALLS = 8
MAX_TOOL_ARGUMENTS_CHARS = 1024
MAX_TOOL_OUTPUT_CHARS = 2048
#: characters of the agent's system prompt as used, carried by a result
MAX_SYSTEM_PROMPT_CHARS = 16_000
#: the agent a node without ``[[agents]]`` hosts: its model, today's prompt, no tools
DEFAULT_AGENT = "generalist"
#: a tool output this short, on one line, is restated as the answer (restated_answer)
MAX_RESTATED_CHARS = 100
HASH_LEN = 32

__all__ = [
    "DEFAULT_AGENT", "MAX_AGENT_NAME_LEN", "MAX_EMBEDDING_DIM", "MAX_NEEDS_CHARS",
    "MAX_NEED_SKILLS", "MAX_SKILL_LEN", "MAX_SYSTEM_PROMPT_CHARS", "MAX_TOOL_CALLS",
    "AgentMatch", "Need", "ToolCallRecord", "ToolOutput", "canonical_arguments", "card_match",
    "check_need", "need_vector", "restated_answer", "tool_transcript",
]


@message(183)
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRecord(Message):
    """One tool call of an agent, as its result carries it."""

    name: str = limits(max_len=MAX_TOOL_NAME_LEN)
    #: the arguments object as canonical JSON (sorted keys, no spaces)
    arguments: str = limits(max_len=MAX_TOOL_ARGUMENTS_CHARS)
    #: what the tool returned, or "error: ..." when it refused or failed
    output: str = limits(max_len=MAX_TOOL_OUTPUT_CHARS)

    def check(self) -> None:
        if NAME_PATTERN.fullmatch(self.name) is None:
            raise ValueError(f"tool name {self.name!r} is not [A-Za-z0-9._-]+")
        try:
            parsed = json.loads(self.arguments)
        except ValueError:
            raise ValueError("tool arguments are not JSON") from None
        if not isinstance(parsed, dict):
            raise ValueError("tool arguments are not a JSON object")


def canonical_arguments(arguments: object) -> str:
    """The canonical JSON text of a call's arguments (sorted keys, compact)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_object(record: ToolCallRecord) -> dict[str, Any]:
    """The arguments of a (checked) record as a JSON object."""
    parsed = json.loads(record.arguments)
    return parsed if isinstance(parsed, dict) else {}


class Need(Protocol):
    """What a task's requirement says it needs (protocol.market.messages.Requirement)."""

    @property
    def needs(self) -> str: ...
    @property
    def skills(self) -> tuple[str, ...]: ...
    @property
    def agent(self) -> str: ...
    @property
    def need_embedding(self) -> bytes: ...
    @property
    def need_scale(self) -> float: ...
    @property
    def embedder_hash(self) -> bytes: ...


def check_need(need: Need) -> None:
    """The cross-field rules of a need; raises ValueError (the codec turns it into
    InvalidMessage)."""
    for skill in need.skills:
        if SKILL_PATTERN.fullmatch(skill) is None:
            raise ValueError(f"skill {skill!r} is not a normalized tag")
    if len(set(need.skills)) != len(need.skills):
        raise ValueError("skills repeat")
    if need.agent and NAME_PATTERN.fullmatch(need.agent) is None:
        raise ValueError(f"agent name {need.agent!r} is not [A-Za-z0-9._-]+")
    if not need.need_embedding:
        if need.embedder_hash or need.need_scale != 0.0:
            raise ValueError("an embedder hash or scale without a need vector")
        return
    if not need.needs:
        raise ValueError("a need vector without need text")
    if len(need.embedder_hash) != HASH_LEN:
        raise ValueError(f"a need vector needs a {HASH_LEN}-byte embedder hash")
    if not need.need_scale > 0.0:
        raise ValueError("a need vector needs a positive scale")


def has_need(need: Need) -> bool:
    """Whether a task says what it needs (text, tags or an agent): then bids are matched by
    agent cards; else by today's model rule."""
    return bool(need.needs or need.skills or need.agent)


def need_vector(need: Need) -> list[float] | None:
    """The requester's embedding of the need's text (None when it sent none)."""
    if not need.need_embedding:
        return None
    return dequantize(need.need_embedding, need.need_scale)


def card_match(card: AgentCard | None, need: Need) -> float | None:
    """How well ``card`` fits ``need``, in [0, 1] (protocol.agents.matching.match_score);
    None when there is no card, or the need names another agent."""
    if card is None or (need.agent and card.name != need.agent):
        return None
    return match_score(need_vector(need), need.skills, card.vector(need.embedder_hash),
                       card.skills)


#: agent_match(peer, agent name, requirement) -> the match, None when no such card
AgentMatch = Callable[[str, str, Any], "float | None"]


def agent_matcher(cards_of: Callable[[str], AgentCards | None]) -> AgentMatch:
    """The auction's ``agent_match`` over ``cards_of(peer) -> AgentCards | None`` (the
    requester's ledger: cards as the bidder's node signed them, never the bidder's claim)."""

    def agent_match(peer: str, agent: str, need: Any) -> float | None:
        cards = cards_of(peer)
        return None if cards is None else card_match(cards.card(agent), need)

    return agent_match


def no_cards(peer: str, agent: str, need: Any) -> float | None:
    """The ``agent_match`` of a requester that holds no agent cards: every need-bid refused."""
    return None


# ---------------------------------------------------------------- the text the model reads

_SPACES = re.compile(r"\s+")


def tool_transcript(calls: Sequence[ToolCallRecord]) -> str:
    """The tool calls as the final answer's prompt shows them ("" when none)."""
    lines = []
    for n, c in enumerate(calls, 1):
        lines.append(f"Tool call {n}: {c.name} {c.arguments}")
        lines.append(f"Tool output {n}: {c.output}")
    return "\n".join(lines)


class ToolOutput(Protocol):
    """A tool call as :func:`restated_answer` reads it (a ``ToolCallRecord``, or the executor's
    own record of a call, node/agents/tools.py): its output, "error: ..." when it failed."""

    @property
    def output(self) -> str: ...


def restated_answer(model_answer: str, calls: Sequence[ToolOutput], *, cut: bool = False
                    ) -> str:
    """The answer: the model's, or the last successful call's output when that output is
    one short line the model's answer does not contain (a calculator's result a small model
    fails to copy), or the model's answer was ``cut`` short (at its token budget).
    Deterministic, so a verifier derives the same answer from the same text. The one copy of
    this rule: the executor's tool loop (node/agents/loop.py), its final answer
    (models/cot.py) and every verifier call it."""
    last = next((c for c in reversed(calls) if not c.output.startswith("error:")), None)
    if last is None:
        return model_answer
    output = last.output.strip()
    if output and "\n" not in output and len(output) <= MAX_RESTATED_CHARS and (
            cut or _SPACES.sub("", output) not in _SPACES.sub("", model_answer)):
        return output
    return model_answer
