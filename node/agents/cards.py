"""This node's agent cards and the network's, as the daemon's ledger service keeps them.

:class:`AgentCardsHost` is a helper object the ledger service (node/ledger/service.py) builds
and calls; it owns:

* this node's agents (:attr:`hosted`: node/agents/config.py's ``AgentSpec`` with the model
  resolved; the executor reads system prompts, tools and adapters from here) and their cards:
  at start each description is embedded (node/agents/checks.py's ``CardEmbedder``, in a
  worker thread), quantized and put on a card with the embedder's hash; without an embedder
  (``[ledger] agent_embeddings = false``, or no models extra) cards go out without vectors.
  ``SetAgents`` hands them to the ledger machine, which signs, publishes and republishes them.
* the check of peers' cards (``CardChecker``), fed every new record of another node;
* :meth:`entries`: every live card in the ledger with its node, its node's reputation, and
  its vector when verified (the one thing matching may use).

A card's tools are described by ``tool_info`` (name -> ``AgentTool``). Until the operator's
tool settings (node/agents/settings.py) are wired in, :func:`builtin_tool_info` describes the
built-in tools by their own specs and declares every other tool (an MCP server's)
side-effecting, the safe assumption about a tool nothing is known of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from node.agents.adapters import file_adapter_hash
from node.agents.calculator import Calculator
from node.agents.checks import CardChecker, CardEmbedder
from node.agents.config import AgentConfigError, AgentSpec, hosted_agents
from node.agents.docsearch import DocSearch
from node.agents.tools import ToolSpec
from node.config import ConfigError
from protocol.agents.cards import MAX_TOOL_DESCRIPTION_LEN, AgentCard, AgentCards, AgentTool
from protocol.agents.matching import quantize
from protocol.ledger.cards import HeldCards, RefuseAgentCards, SetAgents

#: the built-in tools' specs (node/agents/calculator.py, node/agents/docsearch.py)
BUILTIN_TOOLS: dict[str, ToolSpec] = {t.spec.name: t.spec for t in (Calculator, DocSearch)}


def builtin_tool_info(name: str) -> AgentTool:
    """A card's description of tool ``name``: a built-in one as it is, any other one
    side-effecting (nothing says it is not)."""
    spec = BUILTIN_TOOLS.get(name)
    if spec is not None:
        return AgentTool(name=name, description=spec.description[:MAX_TOOL_DESCRIPTION_LEN],
                         side_effects=spec.side_effects)
    return AgentTool(name=name, description="", side_effects=True)


def adapter_ref(spec: AgentSpec) -> str | None:
    """What a card says of the agent's adapter: a relay artifact's name as it is, a file by
    the hex of its content hash (blocking: reads the file)."""
    path = spec.adapter_path
    if path is None:
        return spec.adapter
    return file_adapter_hash(path)


def build_card(spec: AgentSpec, vector: Sequence[float] | None, embedder_hash: bytes | None,
               adapter: str | None, price: float,
               tool_info: Callable[[str], AgentTool]) -> AgentCard:
    embedding, scale = quantize(vector) if vector is not None else (b"", 0.0)
    return AgentCard(
        name=spec.name, description=spec.description, skills=spec.skills, model=spec.model,
        adapter=adapter, tools=tuple(tool_info(t) for t in spec.tools),
        price_per_1k_tokens=spec.price if spec.price is not None else price,
        embedding=embedding, embedding_scale=scale,
        embedder_hash=embedder_hash if embedding and embedder_hash else b"",
    )


@dataclass(frozen=True, slots=True)
class AgentEntry:
    """One agent of the network, as this node's ledger holds it."""

    peer_id: str
    card: AgentCard
    #: its vector was re-embedded from its description and agreed (always, for our own)
    verified: bool
    #: the card's vector when verified (our embedder's space), else None: match by tags
    vector: list[float] | None
    #: the node's reputation score, 0..1
    reputation: float
    own: bool


class AgentCardsHost:
    """This node's agents and the check of others' (see the module docstring)."""

    def __init__(self, ledger: Any, declared: Sequence[AgentSpec], embedder: CardEmbedder,
                 tool_info: Callable[[str], AgentTool] = builtin_tool_info) -> None:
        self.ledger = ledger  # node.ledger.service.LedgerService (its machine, clock, submit)
        self.declared = tuple(declared)
        self.embedder = embedder
        self.tool_info = tool_info
        self.hosted: tuple[AgentSpec, ...] = ()
        self.cards: tuple[AgentCard, ...] = ()
        self.checker = CardChecker(embedder, self._refuse, ledger.ctx.log)
        #: set once ``publish`` has run: ``hosted`` and ``cards`` are final (the executor bids
        #: from them, node/agents/hosted.py)
        self.published = trio.Event()

    def agent(self, name: str) -> AgentSpec | None:
        """The hosted agent ``name`` (None: not one of ours)."""
        return next((a for a in self.hosted if a.name == name), None)

    def resolve(self, served_models: Sequence[str]) -> None:
        """Which agents this node hosts, on which model; a ConfigError names an agent's model
        the node does not serve."""
        try:
            self.hosted = hosted_agents(self.declared, served_models)
        except AgentConfigError as exc:
            raise ConfigError(str(exc)) from None

    async def publish(self, price: float) -> None:
        """Embed, build and hand this node's cards to the ledger machine."""
        if not self.hosted:
            self.published.set()
            return
        vectors = await self.embedder.embed_async([a.description for a in self.hosted])
        embedder_hash = await trio.to_thread.run_sync(self.embedder.known_hash)
        adapters = [await trio.to_thread.run_sync(adapter_ref, a) for a in self.hosted]
        self.cards = tuple(
            build_card(a, vectors[i] if vectors else None, embedder_hash, adapters[i], price,
                       self.tool_info)
            for i, a in enumerate(self.hosted))
        await self.ledger.ctx.submit(self.ledger.name, SetAgents(self.cards))
        self.ledger.ctx.log.info("agents.published", agents=[c.name for c in self.cards],
                                 vectors=bool(vectors), problem=self.embedder.problem)
        self.published.set()

    def stored(self, held: HeldCards) -> None:
        """A record was stored: check it when it is another node's."""
        if held.record.peer_id != self.ledger.ctx.identity.peer_id:
            self.checker.note(held)

    async def _refuse(self, peer: str, record_hash: bytes, detail: str) -> None:
        await self.ledger.ctx.submit(self.ledger.name,
                                     RefuseAgentCards(peer, record_hash, detail=detail))

    def matchable(self, peer: str) -> AgentCards | None:
        """``peer``'s live agent cards as a requester may match them: a card whose vector this
        node has not verified (or cannot compare) loses it, so it matches by skill tags only
        (None: the ledger holds no record of ``peer``)."""
        now = self.ledger.ctx.clock()
        record = self.ledger.machine.view.agents(peer, now)
        if record is None or peer == self.ledger.ctx.identity.peer_id:
            return record
        held = self.ledger.machine.state.cards.held.get(peer)
        verified = self.checker.verified_cards(peer, held.hash) if held is not None \
            else frozenset()
        return dataclasses.replace(record, cards=tuple(
            c if c.name in verified else dataclasses.replace(
                c, embedding=b"", embedding_scale=0.0, embedder_hash=b"")
            for c in record.cards))

    def entries(self) -> list[AgentEntry]:
        """Every live agent card in the ledger, by node then card order."""
        now = self.ledger.ctx.clock()
        view = self.ledger.machine.view
        own = self.ledger.ctx.identity.peer_id
        ours = self.embedder.known_hash() if self.embedder.enabled else None
        out = []
        for held in view.agent_records(now):
            peer = held.record.peer_id
            verified = (frozenset(c.name for c in held.record.cards if c.embedding)
                        if peer == own else self.checker.verified_cards(peer, held.hash))
            score = view.reputation(peer, now).score
            for card in held.record.cards:
                ok = card.name in verified
                vector = card.vector(ours) if ok and ours is not None else None
                out.append(AgentEntry(peer_id=peer, card=card, verified=ok, vector=vector,
                                      reputation=score, own=peer == own))
        return out
