"""`symphony simulate plans`: plan mode on the shipped word problems, the daemon's own machine.

The requester is protocol/agents/planning.py's ``PlanningRequester`` (the daemon's auction
and plan pipeline, built as node/market/requester.py builds it: simulations/agents/
plan_world.py); the executors are the protocol's ``Executor`` machines hosting agent cards
with skill tags of the agents population (simulations/agents/population.py ``skill_name``):

* calculators (``arithmetic``, ``math``): answer an arithmetic step exactly, cannot plan (their
  "plan" is prose, which ``parse_plan`` refuses);
* generalists (``general``, ``reasoning``, ``planning``): plan, and answer a step with one
  wrong number per operation with probability ``generalist_error``.

A planner's plan is drawn from a seeded model of plan quality over the item's stored
expression (models/planset.py): the expression's operations in order, one step each
("Compute 7 * 12", then "Compute [1] - 20": ``[n]`` is step n's result, which the executor
reads from the earlier steps' outputs in its question); with ``invalid_rate`` the text is
malformed (read by the real ``parse_plan``), with ``merge_rate`` the whole expression is one
step, with ``untagged_rate`` a step lacks its ``arithmetic`` tag, with ``wrong_rate`` one
operator is wrong. Any executor accepts and stays silent with ``silent_rate`` (its step is
rerouted by the auction's timeout). Everything is seeded: one seed, one report.
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass, replace
from typing import Any

from crypto.keys import Identity
from models.evalset import load_evalset
from models.planset import PLANSET_PATH, load_expressions
from models.stats import wilson_interval
from protocol.agents.cards import AgentCard, AgentCards
from protocol.agents.matching import quantize
from protocol.agents.pipeline import PipelineConfig
from protocol.agents.plan_runs import SubmitPlanTask
from protocol.agents.wire import agent_matcher
from protocol.market.auction import AuctionConfig
from protocol.market.executor import (
    ComputeDone,
    Executor,
    ExecutorConfig,
    ServedModel,
    StartCompute,
)
from protocol.market.options import AuctionOptions, unknown_bidders
from protocol.market.selection import ScoreSelector
from simulations.agents.plan_world import PlanWorld, plan_requester
from simulations.agents.population import skill_name

MODEL = ServedModel(name="sim-135m", family="sim", context=2048, model_hash=b"\x22" * 32,
                    tokens_per_s=100.0, price_per_1k=0.0)
ARITHMETIC = skill_name(0)
CALCULATOR_SKILLS = (ARITHMETIC, "math")
GENERALIST_SKILLS = ("general", "reasoning", "planning")
DEADLINE_MS = 120_000
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
_FLIP = {"+": "-", "-": "+", "*": "+", "//": "*"}


@dataclass(frozen=True, slots=True)
class PlansConfig:
    seed: int = 0
    questions: int = 48
    calculators: int = 2
    generalists: int = 5
    invalid_rate: float = 0.08
    merge_rate: float = 0.15
    untagged_rate: float = 0.1
    wrong_rate: float = 0.03
    generalist_error: float = 0.25
    silent_rate: float = 0.03


# ---------------------------------------------------------------- plans and their arithmetic

def operations(expression: str) -> list[tuple[str, str, str]]:
    """The expression's binary operations in evaluation order, each ``(left, op, right)``
    with an operand a number or ``[n]`` (operation n's result)."""
    out: list[tuple[str, str, str]] = []

    def walk(node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return str(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            out.append((left, _OPS[type(node.op)], right))
            return f"[{len(out)}]"
        raise ValueError(f"not plain arithmetic: {expression!r}")

    walk(ast.parse(expression, mode="eval").body)
    return out


def evaluate(text: str) -> int | None:
    """The value of integer arithmetic ``text`` (+ - * //), None when it is anything else."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = value(node.left), value(node.right)
            op = _OPS[type(node.op)]
            return a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a // b
        raise ValueError("not arithmetic")

    try:
        return value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def plan_text(expression: str, cfg: PlansConfig, rng: random.Random) -> str:
    """A generalist planner's output for an item, drawn from the plan-quality model."""
    if rng.random() < cfg.invalid_rate:
        return rng.choice(['{"steps": [{"instruction": "Compute', '{"steps": []}',
                           '{"plan": "add the numbers"}', "First multiply, then subtract."])
    ops = operations(expression)
    if rng.random() < cfg.merge_rate:
        steps = [f"Compute {expression}"]
    else:
        steps = [f"Compute {a} {op} {b}" for a, op, b in ops]
    if rng.random() < cfg.wrong_rate:
        n = rng.randrange(len(steps))
        op = next(o for o in _FLIP if f" {o} " in steps[n])
        steps[n] = steps[n].replace(f" {op} ", f" {_FLIP[op]} ", 1)
    return json.dumps({"steps": [
        {"instruction": s, "needs": "",
         "skills": [] if rng.random() < cfg.untagged_rate else [ARITHMETIC]} for s in steps]})


_EARLIER = re.compile(r"^(\d+)\. .* -> (.*)$", re.MULTILINE)
_OWN = re.compile(r"Your step \(\d+ of \d+\): Compute (.+)$", re.MULTILINE)


def step_answer(question: str, exact: bool, error: float, rng: random.Random) -> str:
    """An executor's output for a step's question (protocol.agents.plan_runs.step_question):
    its ``Compute`` expression with each ``[n]`` replaced by step n's output, evaluated; a
    non-exact agent gets each operation wrong with probability ``error``."""
    own = _OWN.search(question)
    if own is None:
        return "I cannot tell what to compute."
    outputs = {int(n): out.strip() for n, out in _EARLIER.findall(question)}
    text = re.sub(r"\[(\d+)\]", lambda m: f"({outputs.get(int(m.group(1)), 'x')})", own.group(1))
    result = evaluate(text)
    if result is None:
        return "I cannot compute that."
    ops = len(re.findall(r" (?:\+|-|\*|//) ", text))
    if not exact and any(rng.random() < error for _ in range(ops)):
        result += rng.choice([-10, -2, -1, 1, 2, 10])
    return str(result)


# ---------------------------------------------------------------- the agents and the world

def agent_card(name: str, skills: tuple[str, ...], rng: random.Random) -> AgentCard:
    data, scale = quantize([rng.gauss(0.0, 1.0) for _ in range(8)])
    return AgentCard(name=name, description=f"{name}: {', '.join(skills)}", skills=skills,
                     model=None, adapter=None, tools=(), price_per_1k_tokens=0.0,
                     embedding=data, embedding_scale=scale, embedder_hash=b"\x33" * 32)


@dataclass(frozen=True, slots=True)
class SimExecutor:
    peer: str
    card: AgentCard

    @property
    def calculator(self) -> bool:
        return ARITHMETIC in self.card.skills


def population(cfg: PlansConfig, rng: random.Random) -> list[tuple[Identity, SimExecutor]]:
    """Calculators and generalists, one agent each, on nodes numbered in a random order."""
    kinds = ["calculator"] * cfg.calculators + ["generalist"] * cfg.generalists
    rng.shuffle(kinds)
    out = []
    for i, kind in enumerate(kinds):
        who = Identity.from_seed(bytes([100 + i]) * 32)
        skills = CALCULATOR_SKILLS if kind == "calculator" else GENERALIST_SKILLS
        out.append((who, SimExecutor(who.peer_id, agent_card(kind, skills, rng))))
    return out


class Answers:
    """What each simulated agent computes for a ``StartCompute`` (seeded per task and peer)."""

    def __init__(self, cfg: PlansConfig, agents: dict[str, SimExecutor],
                 expressions: dict[str, str]) -> None:
        self.cfg, self.agents, self.expressions = cfg, agents, expressions

    def __call__(self, peer: str, start: StartCompute, now: int) -> ComputeDone | None:
        agent = self.agents[peer]
        rng = random.Random(f"{self.cfg.seed}:{peer}:{start.task.task_id.hex()}:{start.attempt}")
        if rng.random() < self.cfg.silent_rate:
            return None
        if start.task.style == "plan":
            expression = self.expressions.get(start.task.question)
            text = "I add things up exactly." if agent.calculator or expression is None \
                else plan_text(expression, self.cfg, rng)
            ms = 1_500
        else:
            text = step_answer(start.task.question, agent.calculator, self.cfg.generalist_error,
                               rng)
            ms = 50 if agent.calculator else 800
        return ComputeDone(task_id=start.task.task_id, attempt=start.attempt, answer=text,
                           cot=text, confidence=0.99 if agent.calculator else 0.7, tokens=16,
                           compute_ms=ms, model_hash=MODEL.model_hash)


def build_world(cfg: PlansConfig, requester: Any = None,
                know_bidders: bool = True) -> tuple[PlanWorld, list[SimExecutor]]:
    """The scenario's world. ``know_bidders``: the auction is told how many executors could
    bid (every one, as a daemon's ledger counts them), so a step's bid window closes once all
    have bid rather than at its deadline (protocol/market/bidding.py: a step names a need, so
    its window waits for a better match than the first arrivals'). ``requester`` (a
    PlanningRequester as the daemon built it, with identity ``Identity.from_seed(b"R" * 32)``, rng ``Random(seed)`` and the agents' cards
    from :func:`cards_of`) replaces the simulator's own (the one-copy test)."""
    rng = random.Random(cfg.seed)
    nodes = population(cfg, rng)
    agents = {e.peer: e for _, e in nodes}
    me = Identity.from_seed(b"R" * 32)
    if requester is None:
        options = AuctionOptions(
            agent_match=agent_matcher(cards_of(list(agents.values())).get),
            possible_bidders=(lambda task: len(agents)) if know_bidders else unknown_bidders)
        requester = plan_requester(me, ScoreSelector(), random.Random(cfg.seed),
                                   AuctionConfig(), PipelineConfig(),
                                   options)
    executors = {who.peer_id: Executor(who, ExecutorConfig(models=(MODEL,), agents=(e.card,)))
                 for who, e in nodes}
    expressions = {item.problem.question: load_expressions(PLANSET_PATH)[item.id]
                   for item in load_evalset(PLANSET_PATH)}
    latency = {peer: rng.randint(1, 30) for peer in agents}
    return PlanWorld(requester, me.peer_id, executors, Answers(cfg, agents, expressions),
                     latency), list(agents.values())


def cards_of(agents: list[SimExecutor]) -> dict[str, AgentCards]:
    """Each executor's card record, as the requester's ledger would hold it."""
    return {a.peer: AgentCards(network_id="sim", peer_id=a.peer, seq=1, issued_at_ms=0,
                               expires_at_ms=10**12, cards=(a.card,)) for a in agents}


# ---------------------------------------------------------------- the scenario

def ask_all(world: PlanWorld, questions: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Ask each ``(task id seed, question)`` in turn; each one's final plan snapshot."""
    finals = []
    for tag, question in questions:
        task_id = random.Random(tag).randbytes(32)
        world.submit(SubmitPlanTask(task_id=task_id, question=question, answer_type="number",
                                    deadline_ms=DEADLINE_MS))

        def over(key: str = task_id.hex()) -> bool:
            return world.plans.get(key, {}).get("phase", "running") != "running"

        world.run_until(world.now + DEADLINE_MS + 10_000, over)
        finals.append(world.plans[task_id.hex()])
    return finals


def summarize(finals: list[dict[str, Any]], answers: list[str], world: PlanWorld,
              agents: list[SimExecutor]) -> dict[str, Any]:
    counters = world.requester.pipeline.counters
    valid, invalid = counters.get("plans_valid", 0), counters.get("plans_invalid", 0)
    plans = [p for f in finals for p in f["plans"] if p["steps"]]
    steps = [s for p in plans for s in p["steps"] if s["done"]]
    calcs = {a.peer for a in agents if a.calculator}
    tagged = [s for s in steps if ARITHMETIC in s["requirement"]["skills"]]
    hits = sum(str(f["answer"]) == a for f, a in zip(finals, answers, strict=True))
    latency = [(f["finished_at_ms"] - f["created_at_ms"]) / 1000 for f in finals]
    ci95 = [round(bound, 4) for bound in wilson_interval(hits, len(finals))]
    return {
        "questions": len(finals), "plans_valid_fraction": round(valid / max(1, valid + invalid), 4),
        "steps_per_plan": round(sum(len(p["steps"]) for p in plans) / max(1, len(plans)), 4),
        "accuracy_plan": round(hits / len(finals), 4), "accuracy_plan_ci95": ci95,
        "plans_answered": sum(p["state"] == "answered" for p in plans),
        "plan_tasks_failed": counters.get("plan_tasks_failed", 0),
        "replans": counters.get("replans", 0), "steps_failed": counters.get("steps_failed", 0),
        "steps_rerouted": sum(int(f["steps_rerouted"]) for f in finals),
        "steps_to_calculator": round(sum(s["executor"] in calcs for s in tagged)
                                     / max(1, len(tagged)), 4),
        "latency_plan_s": round(sum(latency) / len(latency), 4),
        "messages": world.counters.get("messages", 0),
    }


def run_plans_scenario(seed: int = 0, questions: int = 48, **overrides: Any) -> dict[str, Any]:
    """Ask the first ``questions`` items of models/data/planset.jsonl in plan mode (the module
    docstring says how); ``overrides`` are PlansConfig fields."""
    cfg = replace(PlansConfig(seed=seed, questions=questions), **overrides)
    items = load_evalset(PLANSET_PATH)[:cfg.questions]
    world, agents = build_world(cfg)
    finals = ask_all(world, [(f"{seed}:{it.id}", it.problem.question) for it in items])
    report = {"seed": seed, "calculators": cfg.calculators, "generalists": cfg.generalists}
    report.update(summarize(finals, [it.answer for it in items], world, agents))
    return report
