"""The task a chain ask is (node/market/chain_asks.py): its prompt, its decoding, its snapshot.

* :func:`prompt_of` is the prompt an executor would build for the same task
  (models.cot.build_prompt), :func:`decoding_of` the ask's sampling as the chain requester's
  :class:`~node.inference.decoding.Decoding` (unset temperature: greedy, one chain).
* Snapshots have the market's shape (protocol.market.state.snapshot), so the CLI, the
  dashboard, ``GET /tasks/{id}`` and the OpenAI routes read them alike: :func:`running_snapshot`
  when the ask is accepted, :func:`finished_snapshot` with the one result (executor
  ``"chain"``, attempt 0) and one answered attempt per hop of the chain that finished it,
  :func:`failed_snapshot` with the reason. ``chain`` holds what only a chain has: why it ran
  on a chain, the route (first and final), recoveries, tokens/s, the acceptance rate.
"""

from __future__ import annotations

from typing import Any

from node.inference.decoding import MAX_DRAFT, MAX_TOKENS, Decoding
from node.market.ask_request import AskError
from protocol.inference.placement import Placement
from protocol.market.events import SubmitTask
from protocol.market.sampling import default_temperature

#: the executor name of a chain's result
CHAIN_EXECUTOR = "chain"
#: what a chain's result reports that the market's results carry and a chain has not
NO_COMMITMENT = ""


def prompt_of(event: SubmitTask) -> str | list[dict[str, str]]:
    """What the model reads: the executor's prompt for the same task."""
    from models.cot import Problem, build_prompt
    from protocol.answers import AnswerType

    problem = Problem(question=event.question, answer_type=AnswerType(event.answer_type),
                      choices=event.choices, style=event.style,
                      history=tuple({"role": t.role, "content": t.content}
                                    for t in event.history))
    return build_prompt(problem)


def decoding_of(event: SubmitTask, speculative: object) -> Decoding:
    """The ask's decoding on a chain; raises AskError naming a field a chain cannot honour."""
    if speculative is None:
        speculative = 0
    if type(speculative) is not int or not 0 <= speculative <= MAX_DRAFT:
        raise AskError(f"speculative must be an integer in [0, {MAX_DRAFT}]", "speculative")
    if event.max_tokens > MAX_TOKENS:
        raise AskError(f"max_tokens must be at most {MAX_TOKENS} on a chain", "max_tokens")
    temperature = event.temperature
    if temperature is None:
        temperature = default_temperature(1)
    return Decoding(max_tokens=event.max_tokens, temperature=temperature, top_p=event.top_p,
                    seed=event.seed, speculative=speculative, stop=event.stop)


def running_snapshot(event: SubmitTask, placement: Placement, now_ms: int) -> dict[str, Any]:
    """The snapshot of a chain ask just accepted."""
    assert event.task_id is not None  # parse_ask always draws one
    return {
        "task_id": event.task_id.hex(), "phase": "running", "question": event.question,
        "answer_type": event.answer_type, "choices": list(event.choices),
        "model": placement.model, "family": event.family, "min_context": event.min_context,
        "k": 1, "max_price": event.max_price, "max_tokens": event.max_tokens,
        "style": event.style,
        "history": [{"role": t.role, "content": t.content} for t in event.history],
        "temperature": event.temperature if event.temperature is not None else 0.0,
        "top_p": event.top_p, "seed": event.seed, "stop": list(event.stop),
        "allow_self": False, "round": 0, "next_attempt": 0, "tried": [],
        "created_at_ms": now_ms, "deadline_at_ms": now_ms + event.deadline_ms,
        "first_assigned_at_ms": now_ms, "finished_at_ms": None, "answer": None,
        "partial": False, "failure": None, "votes": [], "results": [], "attempts": [],
        "chain": {"reason": placement.reason},
    }


def _answer(snap: dict[str, Any], text: str) -> tuple[str, str | None]:
    """(the raw answer, its normalized form) as an executor reads them from ``text``."""
    from models.cot import Problem, answer_of
    from protocol.answers import AnswerType, normalize_answer

    answer_type = AnswerType(snap["answer_type"])
    problem = Problem(question=snap["question"], answer_type=answer_type,
                      choices=tuple(snap["choices"]), style=snap["style"])
    raw = answer_of(problem, text)
    if snap["style"] in ("chat", "plain"):
        return raw, normalize_answer(AnswerType.TEXT, raw)
    return raw, normalize_answer(answer_type, raw, problem.choices) if raw else None


def finished_snapshot(snap: dict[str, Any], event: SubmitTask, out: dict[str, Any],
                      now_ms: int, cancelled: bool = False) -> dict[str, Any]:
    """The snapshot of a chain ask once ``out`` (the requester's answer) is in."""
    if cancelled:
        return failed_snapshot(snap, "the stream's client went away; generation stopped",
                               now_ms)
    raw, normalized = _answer(snap, out["text"])
    hops = out["final_chain"]
    result = {
        "executor": CHAIN_EXECUTOR, "attempt": 0, "answer": raw, "normalized": normalized,
        "weight": 1.0, "confidence": None, "match_score": 1.0,
        "tokens": out["completion_tokens"], "prompt_tokens": out["prompt_tokens"],
        "finish_reason": out["finish_reason"], "compute_ms": int(out["wall_s"] * 1000),
        "model_hash": NO_COMMITMENT, "fingerprint_root": NO_COMMITMENT, "cot": out["text"],
        "received_at_ms": now_ms, "envelope": NO_COMMITMENT,
    }
    attempts = [{"attempt": i, "peer": h["peer"], "state": "answered",
                 "reason": f"blocks {h['start']}-{h['end']}",
                 "assigned_at_ms": snap["created_at_ms"], "due_at_ms": snap["deadline_at_ms"],
                 "model": snap["model"], "match_score": 1.0, "price": 0.0,
                 "est_latency_ms": 0} for i, h in enumerate(hops)]
    votes = [] if normalized is None else [
        {"answer": normalized, "weight": 1.0, "count": 1, "share": 1.0,
         "voters": [CHAIN_EXECUTOR]}]
    chain = {**snap["chain"], "route": out["chain"], "final_route": hops,
             "recoveries": out["recoveries"], "tokens_per_s": out["tokens_per_s"],
             "wall_s": out["wall_s"], "speculative": out["speculative"], "rule": out["rule"],
             "acceptance_rate": out["acceptance_rate"], "steps": out["steps"],
             "precision": out["precision"]}
    return {**snap, "phase": "done", "finished_at_ms": now_ms, "answer": normalized,
            "votes": votes, "results": [result], "attempts": attempts, "chain": chain}


def failed_snapshot(snap: dict[str, Any], failure: str, now_ms: int) -> dict[str, Any]:
    return {**snap, "phase": "failed", "finished_at_ms": now_ms, "failure": failure}
