"""Symphony's plan pipeline: planners decompose a task, each step is its own market task,
the plans' answers are voted. Sans-IO; one copy for the daemon and the simulator.

Contract
--------
``PlanPipeline.handle(event, now) -> effects`` and ``next_deadline()``, like every machine.
It never runs an auction itself: every planner and step is a *child task* that it asks the
task market for by a ``SubmitTask`` effect (``deferred``: the child's own vote neither attests
nor rewards), which the driver hands to its auction (the daemon embeds the step's need
first). The driver feeds each child's final snapshot back as :class:`ChildFinished`
(protocol.agents.plan_runs.child_finished). So each step is beaconed, screened, picked by the
selector (score or LinUCB), assigned, retried with the next candidate when its executor fails
or times out, signed, and verified exactly as a task is (layer states, re-run read-only
tools: the verified auction, when the driver's auction is one).

For a ``SubmitPlanTask`` the pipeline promises:

1. **Plans.** One child with ``k = planners``, style ``plan`` and the ``planning`` skill, so
   the selector takes the top ``planners`` planner bids; each result is parsed with
   ``parse_plan``. An invalid plan is attested ``wrong`` (as an unparseable task answer is),
   rewards its planner 0, and its slot asks one fresh planner (``replans``; earlier planners
   excluded). A valid plan rewards its planner 1.
2. **Steps.** Each slot runs its plan's steps in order, the slots side by side. A step's child
   asks for the step's requirement (needs, skills), shows the executor the earlier steps'
   outputs (``step_question``), and gets a share of what is left of the task's time (the
   steps left split it) and of the plan's price. Intermediate steps are ``chat`` (the reply
   is the output), the final step ``cot`` with the task's answer type (its final answer is
   the plan's). A child that fails is retried, leaving out the peers that failed it, up to
   ``step_tries``; then the plan fails and one fresh planner replans the slot.
3. **Vote.** Once every slot is answered or failed (or at the task's deadline, unfinished
   slots failed), ``plan_vote`` over the answered slots (each weighed by its final
   executor's reputation and confidence and the geometric mean of its steps' matches). Then
   every step's executor gets its delayed reward (``Reward``: 1 if its plan's answer is
   confirmed by the other plans, else 0: Symphony-Coord's post-vote feedback to LinUCB) and
   the matching attestation (``completed``/``wrong``).

Effects: ``SubmitTask``, ``CancelTask``, ``Reward`` (for the auction), ``Attest``, ``Emit``,
:class:`PlanUpdated`. Hostile input is the children's results only (the plans' JSON, the
outputs): a plan is checked by ``parse_plan``, outputs are copied within the market's limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protocol.agents.plan_runs import (
    ChildFinished,
    PlanSlot,
    PlanTask,
    PlanUpdated,
    SlotState,
    StepRun,
    SubmitPlanTask,
    plan_snapshot,
    step_question,
)
from protocol.agents.plans import InvalidPlan, parse_plan
from protocol.answers import AnswerType
from protocol.errors import LocalProtocolError
from protocol.machine import Effect, Emit, Tick
from protocol.market.events import (
    COMPLETED,
    TASK_ATTEST,
    WRONG,
    Attest,
    CancelTask,
    Reward,
    SubmitTask,
)
from protocol.market.messages import MAX_K, MAX_TASK_MS, TASK_ID_LEN
from protocol.market.voting import PlanBallot, plan_vote

#: the skill tag a planner's card carries (the default generalist's card does)
PLANNING_SKILL = "planning"
#: the task style whose executor writes a plan under the plan grammar
PLAN_STYLE = "plan"
#: finished plan tasks kept (their snapshots are the driver's to store)
MAX_FINISHED = 256


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    #: planners asked for a plan (the top bids by the selector)
    planners: int = 3
    #: child tasks one step may take (each leaving out the peers that failed it) before its
    #: plan fails
    step_tries: int = 2
    #: fresh planners one slot may ask after an invalid or failed plan
    replans: int = 1
    #: the part of the task's time the first planners' task may take
    plan_share: float = 0.4
    #: tokens a planner may write (the plan's JSON)
    plan_tokens: int = 256
    #: the least time a child task is given; with less left, the slot fails instead
    min_child_ms: int = 1_000

    def __post_init__(self) -> None:
        if not 1 <= self.planners <= MAX_K:
            raise ValueError(f"planners must be in [1, {MAX_K}]")
        if self.step_tries < 1 or self.replans < 0 or self.plan_tokens < 1:
            raise ValueError("step_tries and plan_tokens must be positive, replans >= 0")
        if not 0.0 < self.plan_share < 1.0:
            raise ValueError("plan_share must be in (0, 1)")


class PlanPipeline:
    """Plan-mode tasks of one requester; ``reputation(peer)`` weighs the vote over plans,
    ``new_id()`` draws a child task's id (the caller's seeded randomness)."""

    def __init__(self, config: PipelineConfig, reputation: Callable[[str], float],
                 new_id: Callable[[], bytes]) -> None:
        self.config = config
        self.reputation = reputation
        self.new_id = new_id
        self.tasks: dict[bytes, PlanTask] = {}
        #: child task id -> (plan task id, slot index or -1 for the first planners' task)
        self.children: dict[bytes, tuple[bytes, int]] = {}
        self.counters: dict[str, int] = {}

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    # ---------------------------------------------------------------- machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, SubmitPlanTask):
            return self._submit(event, now)
        if isinstance(event, ChildFinished):
            return self._child(event, now)
        if isinstance(event, Tick):
            return [e for t in list(self.tasks.values())
                    if not t.finished and now >= t.deadline_at_ms
                    for e in self._deadline(t, now)]
        return []

    def next_deadline(self) -> int | None:
        times = [t.deadline_at_ms for t in self.tasks.values() if not t.finished]
        return min(times) if times else None

    def is_child(self, task_id: bytes) -> bool:
        return task_id in self.children

    # ---------------------------------------------------------------- children

    def _child_task(self, task: PlanTask, slot: int, now: int, **fields: object) -> SubmitTask:
        """A ``SubmitTask`` for a child of ``task``, recorded as ``slot``'s."""
        child = self.new_id()
        self.children[child] = (task.spec.task_id, slot)
        spec = task.spec
        return SubmitTask(task_id=child, model=spec.model, family=spec.family,
                          allow_self=spec.allow_self, seed=spec.seed, deferred=True,
                          **fields)  # type: ignore[arg-type]

    def _planners(self, task: PlanTask, slot: int, k: int, deadline_ms: int,
                  now: int) -> SubmitTask:
        return self._child_task(
            task, slot, now, question=task.spec.question, answer_type=AnswerType.TEXT.value,
            deadline_ms=deadline_ms, k=k, style=PLAN_STYLE, skills=(PLANNING_SKILL,),
            max_price=task.spec.max_price, max_tokens=self.config.plan_tokens,
            exclude=task.used_planners())

    def _submit(self, ev: SubmitPlanTask, now: int) -> list[Effect]:
        if len(ev.task_id) != TASK_ID_LEN or ev.task_id in self.tasks:
            raise LocalProtocolError("a plan task needs a new task id")
        if not 1 <= ev.deadline_ms <= MAX_TASK_MS:
            raise LocalProtocolError(f"deadline_ms must be in [1, {MAX_TASK_MS}]")
        planners = ev.planners if ev.planners is not None else self.config.planners
        if not 1 <= planners <= MAX_K:
            raise LocalProtocolError(f"planners must be in [1, {MAX_K}]")
        task = PlanTask(spec=ev, planners=planners, created_at_ms=now,
                        deadline_at_ms=now + ev.deadline_ms)
        self.tasks[ev.task_id] = task
        self._count("plan_tasks")
        first = self._planners(task, -1, planners,
                               max(1, int(ev.deadline_ms * self.config.plan_share)), now)
        task.first_child = first.task_id
        return [first, Emit("plan.submitted", {"task_id": ev.task_id.hex(), "planners": planners}),
                PlanUpdated(plan_snapshot(task))]

    def _child(self, ev: ChildFinished, now: int) -> list[Effect]:
        owner = self.children.pop(ev.task_id, None)
        if owner is None:
            self._count("children_unknown")
            return []
        task = self.tasks.get(owner[0])
        if task is None or task.finished:
            return []
        effects: list[Effect] = []
        if owner[1] < 0:
            effects += self._first_plans(task, ev, now)
        else:
            slot = task.slots[owner[1]]
            if slot.state is SlotState.PLANNING:
                effects += self._replanned(task, slot, ev, now)
            elif slot.state is SlotState.RUNNING:
                effects += self._step_done(task, slot, ev, now)
        return effects + self._maybe_vote(task, now)

    # ---------------------------------------------------------------- plans

    def _first_plans(self, task: PlanTask, ev: ChildFinished, now: int) -> list[Effect]:
        if not ev.results:
            task.failure = f"no planner answered: {ev.failure or 'no result'}"
            return []
        effects: list[Effect] = []
        for n, result in enumerate(ev.results[:task.planners]):
            slot = PlanSlot(index=n, replans_left=self.config.replans, planner=result.executor,
                            planner_child=ev.task_id)
            task.slots.append(slot)
        for slot, result in zip(task.slots, ev.results, strict=False):
            effects += self._take_plan(task, slot, result.answer, now)
        return effects

    def _take_plan(self, task: PlanTask, slot: PlanSlot, text: str, now: int) -> list[Effect]:
        """Parse ``slot``'s planner's ``text``: run the plan, or attest it and replan."""
        assert slot.planner_child is not None  # set with the planner
        try:
            plan = parse_plan(text)
        except InvalidPlan as exc:
            self._count("plans_invalid")
            effects: list[Effect] = [
                Attest(slot.planner, slot.planner_child, TASK_ATTEST, WRONG,
                       f"invalid plan: {exc}"[:200]),
                Reward(slot.planner_child, slot.planner, 0.0)]
            return effects + self._replan(task, slot, f"invalid plan: {exc}", now)
        self._count("plans_valid")
        slot.plan = plan
        slot.steps = [StepRun(step=s) for s in plan.steps]
        slot.state = SlotState.RUNNING
        return [Attest(slot.planner, slot.planner_child, TASK_ATTEST, COMPLETED, "valid plan"),
                Reward(slot.planner_child, slot.planner, 1.0), *self._next_step(task, slot, now)]

    def _replan(self, task: PlanTask, slot: PlanSlot, why: str, now: int) -> list[Effect]:
        """Ask one fresh planner for ``slot`` while it may replan and time is left; else the
        slot fails."""
        slot.replaced.append({"planner": slot.planner, "why": why})
        slot.planner, slot.plan, slot.steps = "", None, []
        left = task.deadline_at_ms - now
        if slot.replans_left <= 0 or left < 2 * self.config.min_child_ms:
            slot.state, slot.failure = SlotState.FAILED, why
            return []
        slot.replans_left -= 1
        slot.state = SlotState.PLANNING
        self._count("replans")
        child = self._planners(task, slot.index, 1, int(left * self.config.plan_share), now)
        slot.planner_child = child.task_id
        return [child, Emit("plan.replan", {"task_id": task.spec.task_id.hex(),
                                            "slot": slot.index, "why": why[:200]})]

    def _replanned(self, task: PlanTask, slot: PlanSlot, ev: ChildFinished,
                   now: int) -> list[Effect]:
        if not ev.results:
            slot.state, slot.failure = SlotState.FAILED, f"no planner replanned: {ev.failure}"
            return []
        slot.planner = ev.results[0].executor
        return self._take_plan(task, slot, ev.results[0].answer, now)

    # ---------------------------------------------------------------- steps

    def _next_step(self, task: PlanTask, slot: PlanSlot, now: int) -> list[Effect]:
        """Submit ``slot``'s first step not done, or mark the slot answered."""
        index = next((i for i, r in enumerate(slot.steps) if not r.done), None)
        if index is None:
            slot.state = SlotState.ANSWERED
            return [PlanUpdated(plan_snapshot(task))]
        assert slot.plan is not None  # a running slot has its plan
        run, steps_left = slot.steps[index], len(slot.steps) - index
        budget = (task.deadline_at_ms - now) // steps_left
        if budget < self.config.min_child_ms:
            return self._replan(task, slot, f"no time left for step {index + 1}", now)
        last = index == len(slot.steps) - 1
        child = self._child_task(
            task, slot.index, now,
            question=step_question(task.spec.question, slot.plan, slot.steps, index),
            answer_type=task.spec.answer_type if last else AnswerType.TEXT.value,
            choices=task.spec.choices if last else (), style="cot" if last else "chat",
            deadline_ms=budget, k=1, needs=run.step.needs, skills=run.step.skills,
            max_price=task.spec.max_price / len(slot.steps), max_tokens=task.spec.max_tokens,
            exclude=tuple(run.failed_peers))
        run.child, run.tries = child.task_id, run.tries + 1
        return [child, PlanUpdated(plan_snapshot(task))]

    def _step_done(self, task: PlanTask, slot: PlanSlot, ev: ChildFinished,
                   now: int) -> list[Effect]:
        run = next((r for r in slot.steps if r.child == ev.task_id), None)
        if run is None:
            return []
        run.peers_tried += len(ev.tried)
        if ev.results:
            r = ev.results[0]
            run.executor, run.agent, run.output = r.executor, r.agent, r.answer
            run.confidence, run.match_score, run.done = r.confidence, r.match_score, True
            return self._next_step(task, slot, now)
        self._count("steps_failed")
        run.failed_peers.extend(p for p in ev.tried if p not in run.failed_peers)
        if run.tries < self.config.step_tries:
            return self._next_step(task, slot, now)
        n = slot.steps.index(run) + 1
        return self._replan(task, slot, f"step {n} failed {run.tries} times: {ev.failure}", now)

    # ---------------------------------------------------------------- the vote

    def _deadline(self, task: PlanTask, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for child, (owner, _) in list(self.children.items()):
            if owner == task.spec.task_id:
                del self.children[child]
                effects.append(CancelTask(child))
        for slot in task.slots:
            if slot.state in (SlotState.PLANNING, SlotState.RUNNING):
                slot.state, slot.failure = SlotState.FAILED, "deadline"
        if not task.slots and not task.failure:
            task.failure = "no plan before the deadline"
        return effects + self._vote(task, now)

    def _maybe_vote(self, task: PlanTask, now: int) -> list[Effect]:
        if task.finished:
            return []
        if task.failure or (task.slots and all(
                s.state in (SlotState.ANSWERED, SlotState.FAILED) for s in task.slots)):
            return self._vote(task, now)
        return []

    def _forget_finished(self) -> None:
        finished = [tid for tid, t in self.tasks.items() if t.finished]
        for tid in finished[:max(0, len(finished) - MAX_FINISHED)]:
            del self.tasks[tid]

    def _vote(self, task: PlanTask, now: int) -> list[Effect]:
        task.finished_at_ms = now
        self._forget_finished()
        answered = [s for s in task.slots if s.state is SlotState.ANSWERED]
        effects: list[Effect] = []
        if not answered:
            task.phase = "failed"
            task.failure = task.failure or "; ".join(
                f"plan {s.index + 1}: {s.failure}" for s in task.slots) or "no plan"
            self._count("plan_tasks_failed")
            effects.append(Emit("plan.failed", {"task_id": task.spec.task_id.hex(),
                                                "why": task.failure[:200]}))
            return effects + [PlanUpdated(plan_snapshot(task))]
        outcome = plan_vote([PlanBallot(
            plan=s.key, executor=s.steps[-1].executor, answer=s.answer,
            confidence=s.steps[-1].confidence, reputation=self.reputation(s.steps[-1].executor),
            step_matches=tuple(r.match_score for r in s.steps)) for s in answered],
            AnswerType(task.spec.answer_type), task.spec.choices)
        task.answer = outcome.winner
        task.votes = [{"answer": r.answer, "weight": r.weight, "count": r.count,
                       "voters": list(r.voters), "share": r.share} for r in outcome.rows]
        task.phase = "done"
        self._count("plan_tasks_done")
        for slot in answered:
            agreed = outcome.confirmed(slot.key)
            for run in slot.steps:
                assert run.child is not None  # a done step ran as a child
                effects += [Reward(run.child, run.executor, 1.0 if agreed else 0.0),
                            Attest(run.executor, run.child, TASK_ATTEST,
                                   COMPLETED if agreed else WRONG)]
        effects.append(Emit("plan.done", {"task_id": task.spec.task_id.hex(),
                                          "answer": task.answer, "plans": len(answered)}))
        return effects + [PlanUpdated(plan_snapshot(task))]
