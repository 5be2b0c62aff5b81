"""The state of plan-mode tasks (protocol/agents/pipeline.py): events, runs, snapshots.

Contract
--------
* :class:`SubmitPlanTask` asks the pipeline for an answer by Symphony's three phases;
  :class:`ChildFinished` tells it how one of its child tasks (a planners' task or a step's
  task, run by the task market's auction) ended; :func:`child_finished` reads that from the
  auction's final ``TaskSnapshot`` data, so the daemon and the simulator turn the same
  snapshot into the same event. :class:`PlanUpdated` carries a plan task's snapshot.
* A :class:`PlanSlot` is one plan of a task: its planner, its parsed plan and its steps'
  runs; a slot whose planner's plan was invalid, or whose plan failed, is replanned by a
  fresh planner while it has ``replans_left`` (the earlier planners are kept in
  ``replaced``). ``plan_snapshot`` is the plan tree ``symphony tasks show`` draws.
* :func:`step_question` is the text a step's executor reads: the task, the plan's earlier
  steps with their outputs, and its own instruction.

Every peer-provided string in a child's result is bounded by the market's wire limits
before it gets here; the pipeline only copies it. The standard library only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.agents.plans import Plan, PlanStep
from protocol.market.messages import MAX_QUESTION_CHARS

#: characters of an earlier step's output shown to the next step's executor
MAX_CONTEXT_OUTPUT_CHARS = 600


@dataclass(frozen=True, slots=True)
class SubmitPlanTask:
    """A local command: answer ``question`` with plans (``--mode plan``)."""

    task_id: bytes
    question: str
    answer_type: str
    deadline_ms: int
    choices: tuple[str, ...] = ()
    #: the price ceiling of one plan (its planner and steps share it)
    max_price: float = 1e6
    #: the token budget of each step
    max_tokens: int = 256
    model: str = ""
    family: str = ""
    allow_self: bool = False
    seed: int = 0
    #: planners asked (None: the pipeline's configured number)
    planners: int | None = None


@dataclass(frozen=True, slots=True)
class ChildResult:
    """One executor's result in a finished child task."""

    executor: str
    agent: str
    answer: str
    confidence: float
    match_score: float


@dataclass(frozen=True, slots=True)
class ChildFinished:
    """A child task ended: its results (none: it failed, ``failure`` says why) and the peers
    it tried (a retried step leaves them out)."""

    task_id: bytes
    results: tuple[ChildResult, ...]
    failure: str = ""
    tried: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlanUpdated:
    """An effect: a plan task's snapshot (store it, show it; final once its phase is not
    ``running``)."""

    snapshot: dict[str, object]


def _num(value: object, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else default


def child_finished(data: Mapping[str, object]) -> ChildFinished | None:
    """The ``ChildFinished`` of a final task snapshot's ``data`` (protocol.market.state
    .snapshot); None while the task is open or when the data is not a task's."""
    task_id, phase = data.get("task_id"), data.get("phase")
    if not isinstance(task_id, str) or phase not in ("done", "failed"):
        return None
    try:
        tid = bytes.fromhex(task_id)
    except ValueError:
        return None
    rows = data.get("results")
    results = []
    for row in rows if isinstance(rows, list) else ():
        if not isinstance(row, Mapping):
            continue
        results.append(ChildResult(
            executor=str(row.get("executor", "")), agent=str(row.get("agent", "")),
            answer=str(row.get("answer", "")), confidence=_num(row.get("confidence")),
            match_score=_num(row.get("match_score"))))
    tried = data.get("tried")
    return ChildFinished(task_id=tid, results=tuple(results),
                         failure=str(data.get("failure", "")),
                         tried=tuple(str(p) for p in tried) if isinstance(tried, list) else ())


class SlotState(enum.Enum):
    PLANNING = "planning"
    RUNNING = "running"
    ANSWERED = "answered"
    FAILED = "failed"


@dataclass(slots=True)
class StepRun:
    """One step of a slot's plan as it runs."""

    step: PlanStep
    tries: int = 0
    child: bytes | None = None
    executor: str = ""
    agent: str = ""
    output: str = ""
    confidence: float = 0.0
    match_score: float = 0.0
    done: bool = False
    #: peers whose tries of this step failed (a retry leaves them out)
    failed_peers: list[str] = field(default_factory=list)
    #: executors the step's children were assigned to, all tries together
    peers_tried: int = 0


@dataclass(slots=True)
class PlanSlot:
    index: int
    replans_left: int
    state: SlotState = SlotState.PLANNING
    planner: str = ""
    planner_child: bytes | None = None
    plan: Plan | None = None
    steps: list[StepRun] = field(default_factory=list)
    failure: str = ""
    #: earlier planners of this slot and why they were replaced
    replaced: list[dict[str, str]] = field(default_factory=list)

    @property
    def answer(self) -> str:
        return self.steps[-1].output if self.state is SlotState.ANSWERED else ""

    @property
    def key(self) -> str:
        """The slot's key in the vote over plans (unique per task)."""
        return f"{self.index}:{self.planner}"


@dataclass(slots=True)
class PlanTask:
    spec: SubmitPlanTask
    planners: int
    created_at_ms: int
    deadline_at_ms: int
    phase: str = "running"
    slots: list[PlanSlot] = field(default_factory=list)
    #: the planners' first task (k planners); its results open the slots
    first_child: bytes | None = None
    answer: str | None = None
    votes: list[dict[str, object]] = field(default_factory=list)
    failure: str = ""
    finished_at_ms: int | None = None

    @property
    def finished(self) -> bool:
        return self.phase != "running"

    def used_planners(self) -> tuple[str, ...]:
        used = {s.planner for s in self.slots if s.planner}
        used.update(r["planner"] for s in self.slots for r in s.replaced)
        return tuple(sorted(used))


def step_question(question: str, plan: Plan, runs: list[StepRun], index: int) -> str:
    """What the executor of step ``index`` reads: the task, the earlier steps and their
    outputs (each cut to ``MAX_CONTEXT_OUTPUT_CHARS``), and its own instruction."""
    lines = [f"Task: {question.strip()}"]
    if index:
        lines.append("Earlier steps and their results:")
        for n in range(index):
            out = runs[n].output.strip()[:MAX_CONTEXT_OUTPUT_CHARS]
            lines.append(f"{n + 1}. {plan.steps[n].instruction.strip()} -> {out}")
    lines.append(f"Your step ({index + 1} of {len(plan.steps)}): "
                 f"{plan.steps[index].instruction.strip()}")
    text = "\n".join(lines)
    if len(text) <= MAX_QUESTION_CHARS:
        return text
    # too long for a task's question: the executor's own step is kept whole, the task and
    # the earlier steps are cut at the end
    context, own = "\n".join(lines[:-1]), lines[-1]
    keep = MAX_QUESTION_CHARS - len(own) - 2
    return f"{context[:keep]}…\n{own}"


def _step_row(run: StepRun) -> dict[str, object]:
    return {"instruction": run.step.instruction,
            "requirement": {"needs": run.step.needs, "skills": list(run.step.skills)},
            "agent": run.agent, "executor": run.executor, "output": run.output,
            "match_score": run.match_score, "confidence": run.confidence,
            "tries": run.tries, "peers_tried": run.peers_tried, "done": run.done,
            "task_id": run.child.hex() if run.child is not None else ""}


def plan_snapshot(task: PlanTask) -> dict[str, object]:
    """The plan task as ``GET /tasks/{id}`` and ``symphony tasks show`` see it: the fields
    every task snapshot has, and ``plans``: each slot's planner, answer and steps."""
    spec = task.spec
    plans = [{"planner": s.planner, "answer": s.answer, "state": s.state.value,
              "failure": s.failure, "replaced": list(s.replaced),
              "planner_task": s.planner_child.hex() if s.planner_child else "",
              "steps": [_step_row(r) for r in s.steps]} for s in task.slots]
    return {
        "task_id": spec.task_id.hex(), "mode": "plan", "phase": task.phase,
        "question": spec.question, "answer_type": spec.answer_type,
        "choices": list(spec.choices), "model": spec.model, "family": spec.family,
        "k": task.planners, "max_price": spec.max_price, "max_tokens": spec.max_tokens,
        "allow_self": spec.allow_self, "created_at_ms": task.created_at_ms,
        "deadline_at_ms": task.deadline_at_ms, "finished_at_ms": task.finished_at_ms,
        "answer": task.answer, "failure": task.failure, "votes": list(task.votes),
        "plans": plans,
        # a step rerouted: one given to more than one executor (the auction's next candidate,
        # or a retry of the step)
        "steps_rerouted": sum(r.peers_tried > 1 for s in task.slots for r in s.steps),
        "results": [], "attempts": [],
    }
