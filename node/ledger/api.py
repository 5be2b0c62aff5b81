"""HTTP routes of the ledger, mounted under ``/ledger`` by the daemon's API (read-only, open
to local readers like ``/status``), and the JSON shapes the CLI prints.

* ``GET /ledger/peers``: every live node, itself included, best reputation first. Query:
  ``model``, ``family``, ``role``, ``min_context``, ``sort`` (a key of
  ``protocol.ledger.view.SORT_KEYS``).
* ``GET /ledger/peers/{peer_id}``: that peer's record (live or not), reputation and the
  attestations about it (newest first, at most ``MAX_LIST``).
* ``GET /ledger/attestations``: held attestations, newest first; ``peer`` (subject),
  ``observer``, ``kind``, ``limit``.
* ``POST /ledger/capability`` (API token): JSON ``{"tags": [...], "price_per_1k_tokens": x}``
  overrides the configured values; the record is re-signed and published (at once, or after
  ``min_republish_ms`` when changes come faster). Answers the record now held.

Times in the JSON are Unix epoch milliseconds; hashes are hex.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import json_object, token_route
from node.service import NodeContext
from protocol.ledger.held import HeldAttestation
from protocol.ledger.machine import LedgerMachine
from protocol.ledger.records import MAX_TAGS, AttestationKind, CapabilityRecord, Role
from protocol.ledger.reputation import Reputation
from protocol.ledger.view import SORT_KEYS, PeerMatch

MAX_LIST = 1000


def reputation_json(rep: Reputation) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(rep).items()}


def record_json(rec: CapabilityRecord) -> dict[str, Any]:
    return {
        "peer_id": rec.peer_id,
        "seq": rec.seq,
        "issued_at_ms": rec.issued_at_ms,
        "expires_at_ms": rec.expires_at_ms,
        "listen_addrs": list(rec.listen_addrs),
        "models": [
            {
                "name": m.name,
                "family": m.family,
                "quantization": m.quantization,
                "context_length": m.context_length,
                "weights_hash": m.weights_hash.hex(),
                "tokens_per_s": m.tokens_per_s,
            }
            for m in rec.models
        ],
        "hardware": {
            "device_kind": rec.hardware.device_kind,
            "device_name": rec.hardware.device_name,
            "memory_bytes": rec.hardware.memory_bytes,
            "cpu_cores": rec.hardware.cpu_cores,
        },
        "price_per_1k_tokens": rec.price_per_1k_tokens,
        "free_slots": rec.free_slots,
        "max_slots": rec.max_slots,
        "load": rec.load,
        "roles": [r.value for r in rec.roles],
        "tags": list(rec.tags),
        "software_version": rec.software_version,
    }


def attestation_json(held: HeldAttestation) -> dict[str, Any]:
    a = held.attestation
    return {
        "hash": held.hash.hex(),
        "observer": held.observer,
        "subject": a.subject,
        "object_id": a.object_id.hex(),
        "kind": a.kind.value,
        "outcome": a.outcome,
        "evidence_hash": a.evidence_hash.hex(),
        "amount": a.amount,
        "observed_at_ms": a.observed_at_ms,
        "expires_at_ms": a.expires_at_ms,
    }


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": message}, status_code=status)


def _limit(request: Request) -> int:
    return min(MAX_LIST, max(1, int(request.query_params.get("limit", str(MAX_LIST)))))


class LedgerAccess(Protocol):
    """What the routes use of the ledger service (node/ledger/service.py passes itself)."""

    ctx: NodeContext
    #: operator changes at run time: ``tags``, ``price_per_1k_tokens``
    overrides: dict[str, Any]

    @property
    def machine(self) -> LedgerMachine: ...

    def now_ms(self) -> int: ...

    def reputation(self, peer: str) -> Reputation: ...

    def find_peers(self, **query: Any) -> list[PeerMatch]: ...

    async def refresh_capability(self) -> None: ...


def ledger_routes(service: LedgerAccess) -> list[BaseRoute]:
    endpoints = LedgerEndpoints(service)
    return [
        token_route("/capability", endpoints.set_capability, methods=["POST"]),
        Route("/peers", endpoints.peers, methods=["GET"]),
        Route("/peers/{peer_id}", endpoints.show_peer, methods=["GET"]),
        Route("/attestations", endpoints.attestations, methods=["GET"]),
    ]


def _capability_change(body: object) -> tuple[dict[str, Any], str]:
    """The overrides a ``POST /ledger/capability`` body asks for, or ({}, what is wrong)."""
    if not isinstance(body, dict) or set(body) - {"tags", "price_per_1k_tokens"}:
        return {}, "the body must be a JSON object with tags and/or price_per_1k_tokens"
    tags, price = body.get("tags"), body.get("price_per_1k_tokens")
    if tags is not None and not (
        isinstance(tags, list)
        and len(tags) <= MAX_TAGS
        and all(isinstance(t, str) and len(t) <= 64 for t in tags)
    ):
        return {}, f"tags must be a list of at most {MAX_TAGS} strings of <= 64 chars"
    if price is not None and (
        isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price <= 1e9
    ):
        return {}, "price_per_1k_tokens must be a number in [0, 1e9]"
    change: dict[str, Any] = {}
    if tags is not None:
        change["tags"] = tuple(tags)
    if price is not None:
        change["price_per_1k_tokens"] = float(price)
    return change, ""


class LedgerEndpoints:
    """One endpoint per route, answering from the ledger service and its view."""

    def __init__(self, service: LedgerAccess) -> None:
        self.service = service
        self.view = service.machine.view

    async def peers(self, request: Request) -> Response:
        q = request.query_params
        try:
            role = Role(q["role"]) if q.get("role") else None
            min_context = int(q.get("min_context", "0"))
        except ValueError as exc:
            return _error(str(exc))
        sort = q.get("sort", "reputation")
        if sort not in SORT_KEYS:
            return _error(f"sort must be one of {', '.join(SORT_KEYS)}")
        found = self.service.find_peers(
            model=q.get("model") or None,
            family=q.get("family") or None,
            role=role,
            min_context=min_context,
            sort_by=sort,
        )
        own = self.service.ctx.identity.peer_id
        return JSONResponse(
            {
                "now_ms": self.service.now_ms(),
                "peers": [
                    {
                        **record_json(m.record),
                        "self": m.peer_id == own,
                        "reputation": reputation_json(m.reputation),
                        "last_seen_ms": m.last_seen_ms,
                    }
                    for m in found
                ],
            }
        )

    async def show_peer(self, request: Request) -> Response:
        peer = request.path_params["peer_id"]
        held = self.view.capability(peer)
        atts = self.view.attestations(subject=peer)
        if held is None and not atts:
            return _error("no record or attestation of this peer", 404)
        now = self.service.ctx.clock()
        return JSONResponse(
            {
                "peer_id": peer,
                "now_ms": self.service.now_ms(),
                "live": held is not None and self.view.capability(peer, now) is not None,
                "record": record_json(held.record) if held is not None else None,
                "last_seen_ms": held.received_at_ms if held is not None else None,
                "reputation": reputation_json(self.service.reputation(peer)),
                "attestations": [attestation_json(a) for a in atts[:MAX_LIST]],
            }
        )

    async def attestations(self, request: Request) -> Response:
        q = request.query_params
        try:
            kind = AttestationKind(q["kind"]) if q.get("kind") else None
            limit = _limit(request)
        except ValueError as exc:
            return _error(str(exc))
        found = self.view.attestations(
            subject=q.get("peer") or None, observer=q.get("observer") or None, kind=kind
        )
        return JSONResponse(
            {"count": len(found), "attestations": [attestation_json(a) for a in found[:limit]]}
        )

    async def set_capability(self, request: Request) -> Response:
        change, problem = _capability_change(await json_object(request))
        if problem:
            return _error(problem)
        self.service.overrides.update(change)
        await self.service.refresh_capability()
        held = self.view.capability(self.service.ctx.identity.peer_id)
        return JSONResponse({"record": record_json(held.record) if held is not None else None})
