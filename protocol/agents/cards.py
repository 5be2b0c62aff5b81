"""Agent cards: what each agent a node hosts is good at, signed by the node, spread in the ledger.

Contract
--------
* An :class:`AgentCard` describes one agent: its name, a free-text description, skill tags,
  the model and LoRA adapter it runs on (optional), the tools it may call (each declared
  read-only or side-effecting), its price, and its description's embedding (int8 components
  and a scale, see protocol.agents.matching.quantize) with the hash of the embedder that made
  it. The agent's system prompt stays with the node that runs it and is never on the wire.
* A node publishes all its agents as **one** :class:`AgentCards` record, signed by the node
  (envelope domain ``AGENTS_DOMAIN``), with a sequence number: a newer record (higher
  ``seq``, :func:`supersedes`) replaces the whole list, so the per-node limit is the record's
  item limit, ``MAX_AGENTS_PER_NODE``, and an agent dropped from the list is gone.
* :func:`open_agent_cards` checks an envelope *as received*, in the order of the ledger's
  other records (protocol/ledger/records.py, whose checks it reuses): size first
  (``MAX_AGENT_CARDS_BYTES``), the domain (an unknown ``.../vN`` is an unknown version), the
  signature over the received payload bytes, the payload's tag and version, its fields, then
  the network, the signer (it must *be* the record's ``peer_id``) and the times. Any failure
  raises the ledger's ``Rejected`` with one ``Rejection`` reason, which carries the sender's
  penalty; nothing else escapes.
* Whether a card's vector is its own description's needs the embedder, so the requester
  checks it (protocol.agents.matching.vector_agrees) after opening.

Tags 180-189 belong to agents. Times are Unix epoch milliseconds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.agents.matching import dequantize
from protocol.codec import Message, encode, limits, message
from protocol.ledger.records import (
    HASH_LEN,
    MAX_CLOCK_SKEW_MS,
    MAX_PEER_ID_LEN,
    MAX_RECORD_TTL_MS,
    check_own_record,
    open_signed,
)

AGENTS_DOMAIN = "symphony/ledger/agents/v1"
_AGENTS_FAMILY = "symphony/ledger/agents/"

#: agents one node may host (the items of its one AgentCards record)
MAX_AGENTS_PER_NODE = 8
MAX_AGENT_NAME_LEN = 64
MAX_DESCRIPTION_LEN = 512
MAX_SKILLS = 8
MAX_SKILL_LEN = 32
MAX_TOOLS = 8
MAX_TOOL_NAME_LEN = 64
MAX_TOOL_DESCRIPTION_LEN = 256
MAX_MODEL_NAME_LEN = 128
#: a LoRA adapter: a relay artifact name, or the hex of its content hash
MAX_ADAPTER_LEN = 128
#: components of a description's embedding (the embedder fixes the actual dimension)
MAX_EMBEDDING_DIM = 1024
MAX_AGENT_PRICE = 1e9
#: signed payload limit of one AgentCards record; a larger envelope is refused as oversized
#: before any other check. A record at every item limit above with ASCII text fits in it.
MAX_AGENT_CARDS_BYTES = 48 * 1024
#: an AgentCards record lives at most as long as a capability record
MAX_AGENT_CARDS_TTL_MS = MAX_RECORD_TTL_MS

#: agent and tool names: what `symphony ask --agent` and the OpenAI `model` field name
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: skill tags, in their normalized form (protocol.agents.matching.normalize_tag)
SKILL_PATTERN = re.compile(r"[a-z0-9][a-z0-9+#._-]*")


@message(180)
@dataclass(frozen=True, slots=True, kw_only=True)
class AgentTool(Message):
    """A tool the agent may call while it answers."""

    name: str = limits(max_len=MAX_TOOL_NAME_LEN)
    description: str = limits(max_len=MAX_TOOL_DESCRIPTION_LEN)
    #: True when the tool may change anything outside the answer (start a process, write a
    #: file, reach the network); such a tool runs only for requesters the operator allows
    side_effects: bool

    def check(self) -> None:
        if NAME_PATTERN.fullmatch(self.name) is None:
            raise ValueError(f"tool name {self.name!r} is not [A-Za-z0-9._-]+")


@message(181)
@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCard(Message):
    name: str = limits(max_len=MAX_AGENT_NAME_LEN)
    description: str = limits(max_len=MAX_DESCRIPTION_LEN)
    skills: tuple[str, ...] = limits(max_items=MAX_SKILLS, max_len=MAX_SKILL_LEN)
    #: a model the node serves; None: the node's default model
    model: str | None = limits(max_len=MAX_MODEL_NAME_LEN)
    #: a LoRA adapter on top of the model (relay artifact name or content hash hex); None: none
    adapter: str | None = limits(max_len=MAX_ADAPTER_LEN)
    tools: tuple[AgentTool, ...] = limits(max_items=MAX_TOOLS)
    price_per_1k_tokens: float = limits(lo=0.0, hi=MAX_AGENT_PRICE)
    #: the description's embedding, one signed byte per component (empty: none)
    embedding: bytes = limits(max_len=MAX_EMBEDDING_DIM)
    #: component = int8 * embedding_scale; 0.0 exactly when there is no embedding
    embedding_scale: float = limits(lo=0.0, hi=1.0)
    #: content hash of the embedder's files (empty exactly when there is no embedding)
    embedder_hash: bytes = limits(max_len=HASH_LEN)

    def check(self) -> None:
        if NAME_PATTERN.fullmatch(self.name) is None:
            raise ValueError(f"agent name {self.name!r} is not [A-Za-z0-9._-]+")
        for skill in self.skills:
            if SKILL_PATTERN.fullmatch(skill) is None:
                raise ValueError(f"skill {skill!r} is not a normalized tag")
        if len(set(self.skills)) != len(self.skills):
            raise ValueError("skills repeat")
        if len({t.name for t in self.tools}) != len(self.tools):
            raise ValueError("tool names repeat")
        if self.model is not None and not self.model:
            raise ValueError("model is empty (None names the node's default)")
        if self.adapter is not None and not self.adapter:
            raise ValueError("adapter is empty (None names no adapter)")
        self._check_embedding()

    def _check_embedding(self) -> None:
        if not self.embedding:
            if self.embedder_hash or self.embedding_scale != 0.0:
                raise ValueError("an embedder hash or scale without an embedding")
            return
        if len(self.embedder_hash) != HASH_LEN:
            raise ValueError(f"an embedding needs a {HASH_LEN}-byte embedder hash")
        if not (math.isfinite(self.embedding_scale) and self.embedding_scale > 0.0):
            raise ValueError("an embedding needs a positive scale")

    def vector(self, embedder_hash: bytes) -> list[float] | None:
        """The description's embedding, or None when the card has none from ``embedder_hash``
        (the requester's embedder: vectors of another embedder are not comparable)."""
        if not self.embedding or self.embedder_hash != embedder_hash:
            return None
        return dequantize(self.embedding, self.embedding_scale)

    @property
    def side_effecting_tools(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools if t.side_effects)


@message(182)
@dataclass(frozen=True, slots=True, kw_only=True)
class AgentCards(Message):
    """Every agent one node hosts; a newer ``seq`` replaces the whole list."""

    network_id: str = limits(max_len=32)
    peer_id: str = limits(max_len=MAX_PEER_ID_LEN)
    seq: int = limits(lo=0)
    issued_at_ms: int = limits(lo=0)
    expires_at_ms: int = limits(lo=0)
    cards: tuple[AgentCard, ...] = limits(max_items=MAX_AGENTS_PER_NODE)

    def check(self) -> None:
        if self.expires_at_ms <= self.issued_at_ms:
            raise ValueError("a record must expire after it was issued")
        if len({c.name for c in self.cards}) != len(self.cards):
            raise ValueError("agent names repeat")

    def card(self, name: str) -> AgentCard | None:
        for c in self.cards:
            if c.name == name:
                return c
        return None


def supersedes(new: AgentCards, old: AgentCards) -> bool:
    """Whether ``new`` replaces ``old``: the same node's record with a higher sequence."""
    return new.peer_id == old.peer_id and new.seq > old.seq


def seal_agent_cards(identity: Identity, record: AgentCards) -> Envelope:
    """Sign ``record`` for ``AGENTS_DOMAIN``. Raises ValueError when it is not this identity's
    record or its encoding exceeds ``MAX_AGENT_CARDS_BYTES`` (peers would refuse it)."""
    if record.peer_id != identity.peer_id:
        raise ValueError(f"record of {record.peer_id} signed by {identity.peer_id}")
    payload = encode(record)
    if len(payload) > MAX_AGENT_CARDS_BYTES:
        raise ValueError(f"agent cards of {len(payload)} bytes exceed {MAX_AGENT_CARDS_BYTES}")
    return Envelope.sign(identity, AGENTS_DOMAIN, payload)


def open_agent_cards(
    envelope: Envelope,
    network_id: str,
    now_ms: int,
    signer: str | None = None,
    max_ttl_ms: int = MAX_AGENT_CARDS_TTL_MS,
    skew_ms: int = MAX_CLOCK_SKEW_MS,
) -> AgentCards:
    """The checked record in ``envelope``, or ``Rejected`` (``signer``: the envelope's peer id
    where the caller has it cached, as for protocol.ledger.records.open_capability)."""
    record = open_signed(envelope, AGENTS_DOMAIN, _AGENTS_FAMILY, MAX_AGENT_CARDS_BYTES,
                         AgentCards)
    check_own_record(record, envelope, network_id, now_ms, signer, max_ttl_ms, skew_ms)
    return record

