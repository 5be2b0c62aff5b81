"""A task the requester left open, rebuilt from its stored snapshot after a restart
(node/market/requester.py resumes it: kept results, running attempts, a new beacon round)."""

from __future__ import annotations

from typing import Any

from protocol.market.auction import KeptResult, RestoredAttempt, RestoreTask
from protocol.market.messages import Requirement, TaskSpec, Turn


def restore_event(snap: dict[str, Any], own_peer: str, remaining_ms: int) -> RestoreTask:
    """Rebuild a ``RestoreTask`` from a stored snapshot (see protocol.market.state.snapshot)."""
    spec = TaskSpec(
        task_id=bytes.fromhex(snap["task_id"]), requester=own_peer, question=snap["question"],
        answer_type=snap["answer_type"], choices=tuple(snap["choices"]),
        requirement=Requirement(
            model=snap["model"], family=snap["family"], min_context=int(snap["min_context"]),
            needs=snap.get("needs", ""), skills=tuple(snap.get("skills", ())),
            agent=snap.get("requested_agent", ""),
            need_embedding=bytes.fromhex(snap.get("need_embedding", "")),
            need_scale=float(snap.get("need_scale", 0.0)),
            embedder_hash=bytes.fromhex(snap.get("embedder_hash", ""))),
        k=int(snap["k"]), max_price=float(snap["max_price"]), max_tokens=int(snap["max_tokens"]),
        style=snap.get("style", "cot"),
        history=tuple(Turn(role=t["role"], content=t["content"]) for t in snap.get("history", ())),
        temperature=float(snap.get("temperature", 0.0)), top_p=float(snap.get("top_p", 1.0)),
        seed=int(snap.get("seed", 0)), stop=tuple(snap.get("stop", ())),
    )
    kept = tuple(KeptResult(bytes.fromhex(r["envelope"]), float(r["match_score"]))
                 for r in snap["results"])
    # an attempt's time left keeps its distance to the task's deadline
    assigned = tuple(
        RestoredAttempt(peer=a["peer"], attempt=int(a["attempt"]),
                        due_in_ms=remaining_ms - (int(snap["deadline_at_ms"])
                                                  - int(a["due_at_ms"])),
                        match_score=float(a["match_score"]), model=a["model"],
                        agent=a.get("agent", ""))
        for a in snap["attempts"] if a["state"] == "assigned")
    return RestoreTask(spec=spec, allow_self=bool(snap["allow_self"]),
                       remaining_ms=max(0, remaining_ms), round=int(snap["round"]),
                       next_attempt=int(snap["next_attempt"]), tried=tuple(snap["tried"]),
                       kept=kept, assigned=assigned, deferred=bool(snap.get("deferred", False)))
