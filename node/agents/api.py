"""``GET /agents`` on the daemon's HTTP API (read-only, open to local readers like
``/status``), and the JSON shape ``symphony agents list`` prints.

The answer is ``{"agents": [...], "count": n}``: every live agent card in this node's ledger,
its own included, best node reputation first (ties by node, then the card's order). Each
entry: ``peer_id``, ``self`` (this node's), ``name``, ``description``, ``skills``, ``tools``
(each ``name``, ``description``, ``side_effects``), ``model``, ``adapter``,
``price_per_1k_tokens``, ``reputation`` (the node's score, 0..1), ``has_vector`` (the card
carries one), ``embedder_hash`` (hex) and ``vector_verified`` (this node re-embedded the
description and the card's vector agreed: node/agents/checks.py). Query ``skill`` keeps the
cards that list that tag, ``peer`` one node's.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.agents.cards import AgentEntry
from protocol.agents.matching import normalize_tag


def entry_json(entry: AgentEntry) -> dict[str, Any]:
    card = entry.card
    return {
        "peer_id": entry.peer_id,
        "self": entry.own,
        "name": card.name,
        "description": card.description,
        "skills": list(card.skills),
        "tools": [{"name": t.name, "description": t.description,
                   "side_effects": t.side_effects} for t in card.tools],
        "model": card.model,
        "adapter": card.adapter,
        "price_per_1k_tokens": card.price_per_1k_tokens,
        "reputation": round(entry.reputation, 6),
        "has_vector": bool(card.embedding),
        "embedder_hash": card.embedder_hash.hex(),
        "vector_verified": entry.verified,
    }


def agent_created(service: Any) -> dict[str, int]:
    """Each agent name on a live card in the ledger of ``service`` (node/ledger/service.py's
    LedgerService; None: no ledger, no agents) -> when the oldest live record naming it was
    signed (Unix seconds): what ``GET /v1/models`` lists (node/api/openai_routes.py)."""
    if service is None:
        return {}
    found: dict[str, int] = {}
    for held in service.machine.view.agent_records(service.ctx.clock()):
        at = held.record.issued_at_ms // 1000
        for card in held.record.cards:
            found[card.name] = min(at, found.get(card.name, at))
    return found


def agents_routes(service: Any) -> list[BaseRoute]:
    """``service``: node/ledger/service.py's LedgerService (its ``agents`` host)."""

    async def list_agents(request: Request) -> Response:
        skill = normalize_tag(request.query_params.get("skill", ""))
        peer = request.query_params.get("peer", "")
        entries = [e for e in service.agents.entries()
                   if (not skill or skill in e.card.skills) and (not peer or e.peer_id == peer)]
        entries.sort(key=lambda e: (-e.reputation, e.peer_id))  # stable: card order kept
        return JSONResponse({"agents": [entry_json(e) for e in entries], "count": len(entries)})

    return [Route("/agents", list_agents, methods=["GET"])]
