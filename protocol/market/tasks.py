"""The requester's open tasks as the auction starts them: submitted, or restored after a restart.

``submitted_task`` checks a local ``SubmitTask`` (our own misuse is a ``LocalProtocolError``)
and builds its spec (a task id drawn from the auction's ``rng`` unless given; the sampling
temperature by protocol/market/sampling.py unless given). ``restored_task`` rebuilds a task
from a ``RestoreTask``: deferred if it was, its kept results re-opened from their signed
envelopes (a damaged or foreign row loses that result, not the task) and its running attempts
kept with their time left. Neither sends anything: protocol/market/auction.py beacons or replans them.
"""

from __future__ import annotations

from random import Random

from crypto.envelope import Envelope, EnvelopeError
from protocol.answers import AnswerType
from protocol.envelopes import open_envelope
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.market.events import RestoreTask, SubmitTask
from protocol.market.messages import (
    MAX_ROUND,
    MAX_TASK_MS,
    RESULT_DOMAIN,
    TASK_ID_LEN,
    BidBody,
    Requirement,
    ResultBody,
    TaskSpec,
)
from protocol.market.sampling import default_temperature
from protocol.market.state import (
    Attempt,
    AttemptState,
    BidInfo,
    OpenTask,
    ResultInfo,
    TaskPhase,
)


def submitted_task(ev: SubmitTask, requester: str, known: dict[bytes, OpenTask], rng: Random,
                   now: int) -> OpenTask:
    """A new task from ``ev`` (not yet in ``known``, the auction's table)."""
    try:
        AnswerType(ev.answer_type)
    except ValueError:
        raise LocalProtocolError(f"unknown answer type {ev.answer_type!r}") from None
    if not 1 <= ev.deadline_ms <= MAX_TASK_MS:
        raise LocalProtocolError(f"deadline_ms must be in [1, {MAX_TASK_MS}]")
    task_id = ev.task_id if ev.task_id is not None else rng.randbytes(TASK_ID_LEN)
    if task_id in known:
        raise LocalProtocolError(f"task {task_id.hex()} exists already")
    spec = TaskSpec(
        task_id=task_id, requester=requester, question=ev.question,
        answer_type=ev.answer_type, choices=ev.choices,
        requirement=Requirement(
            model=ev.model, family=ev.family, min_context=ev.min_context, needs=ev.needs,
            skills=ev.skills, agent=ev.agent, need_embedding=ev.need_embedding,
            need_scale=ev.need_scale, embedder_hash=ev.embedder_hash),
        k=ev.k, max_price=ev.max_price, max_tokens=ev.max_tokens, style=ev.style,
        history=ev.history, top_p=ev.top_p, seed=ev.seed, stop=ev.stop,
        temperature=default_temperature(ev.k) if ev.temperature is None else ev.temperature,
    )
    try:
        spec.check()
        spec.requirement.check()
    except ValueError as exc:
        raise LocalProtocolError(f"task: {exc}") from None
    return OpenTask(spec=spec, allow_self=ev.allow_self, phase=TaskPhase.BIDDING,
                    created_at_ms=now, deadline_at_ms=now + ev.deadline_ms,
                    tried=set(ev.exclude), deferred=ev.deferred, stream=ev.stream)


def restored_task(ev: RestoreTask, requester: str, known: dict[bytes, OpenTask],
                  max_frame: int, now: int) -> OpenTask:
    """``ev``'s task with its kept results and running attempts (not yet in ``known``)."""
    spec = ev.spec
    if spec.task_id in known or spec.requester != requester:
        raise LocalProtocolError("restore of a task that is not ours or already known")
    task = OpenTask(spec=spec, allow_self=ev.allow_self, phase=TaskPhase.BIDDING,
                    created_at_ms=now, deadline_at_ms=now + max(0, ev.remaining_ms),
                    round=min(ev.round, MAX_ROUND), next_attempt=ev.next_attempt,
                    tried=set(ev.tried), rounds_with_bids=min(ev.round, MAX_ROUND) + 1,
                    deferred=ev.deferred)
    for kept in ev.kept:
        try:
            env = Envelope.decode(kept.envelope)
            body = open_envelope(env, RESULT_DOMAIN, ResultBody, max_frame)
        except (InvalidMessage, EnvelopeError):
            continue  # a damaged row loses that result, not the task
        if body.task_id != spec.task_id or env.signer != body.executor:
            continue
        task.results[body.executor] = ResultInfo(body, env, body.attempt, kept.match_score, now)
        task.tried.add(body.executor)
    for ra in ev.assigned:
        if ra.peer in task.results or ra.attempt in task.attempts:
            continue
        bid = BidBody(task_id=spec.task_id, round=task.round, bidder=ra.peer, model=ra.model,
                      model_hash=b"", match_score=ra.match_score, price=0.0,
                      est_latency_ms=0, load=0.0, free_slots=0, hold_ms=1, agent=ra.agent)
        due = min(task.deadline_at_ms, now + max(0, ra.due_in_ms))
        task.attempts[ra.attempt] = Attempt(ra.attempt, ra.peer, BidInfo(bid, now, now, ra.match_score),
                                            AttemptState.ASSIGNED, now, due)
        task.tried.add(ra.peer)
    task.next_attempt = max([task.next_attempt, *(a + 1 for a in task.attempts)])
    return task
