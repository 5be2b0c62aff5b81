"""Plans: a planner's decomposition of a task into ordered steps (Symphony's first phase).

Contract
--------
* :class:`PlanStep` (tag 184) is one step: the instruction its executor follows, and its
  requirement (``needs`` text and ``skills`` tags, the fields a task's ``Requirement`` routes
  by). :class:`Plan` (tag 185) is 1 to ``MAX_PLAN_STEPS`` steps, run in order. Both are
  checked on decode like every message: bounded lengths, a non-blank instruction, skill tags
  normalized (``SKILL_PATTERN``) and not repeated.
* :data:`PLAN_SCHEMA` is the JSON schema a planner's output is generated under (llama.cpp's
  ``LlamaGrammar.from_json_schema(json.dumps(PLAN_SCHEMA))``): every text such a grammar admits
  has the shape :func:`parse_plan` reads, within its bounds.
* :func:`parse_plan` reads a planner's JSON text into a checked ``Plan``. A planner's output is
  as hostile as any peer's bytes: whatever the text, it returns a ``Plan`` or raises the one
  :class:`InvalidPlan`, whose message names what is wrong (never another exception).

The standard library and the codec only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from protocol.agents.cards import MAX_SKILL_LEN, SKILL_PATTERN
from protocol.agents.wire import MAX_NEED_SKILLS, MAX_NEEDS_CHARS
from protocol.codec import Message, limits, message

#: steps of one plan
MAX_PLAN_STEPS = 8
#: characters of one step's instruction
MAX_INSTRUCTION_CHARS = 512
#: characters of a planner's whole output that parse_plan reads (the largest valid plan's
#: JSON, escapes aside, is well under this)
MAX_PLAN_TEXT_CHARS = 16_384

__all__ = [
    "MAX_INSTRUCTION_CHARS", "MAX_PLAN_STEPS", "MAX_PLAN_TEXT_CHARS", "PLAN_SCHEMA",
    "PLANNER_MAX_STEPS", "PLANNER_SCHEMA",
    "InvalidPlan", "Plan", "PlanStep", "parse_plan",
]


class InvalidPlan(ValueError):
    """A planner's output is not a valid plan; the message says why."""


def _check_text(what: str, text: str, max_len: int, *, blank_ok: bool) -> None:
    if not blank_ok and not text.strip():
        raise ValueError(f"{what} is empty")
    if len(text) > max_len:
        raise ValueError(f"{what} is longer than {max_len} characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid unicode (a lone surrogate)") from None


@message(184)
@dataclass(frozen=True, slots=True, kw_only=True)
class PlanStep(Message):
    """One step of a plan: what to do, and what its executor needs to do it."""

    instruction: str = limits(max_len=MAX_INSTRUCTION_CHARS)
    #: the requirement's text: the capability this step needs, matched to agent cards
    needs: str = limits(max_len=MAX_NEEDS_CHARS)
    #: the requirement's skill tags
    skills: tuple[str, ...] = limits(max_items=MAX_NEED_SKILLS)

    def check(self) -> None:
        _check_text("instruction", self.instruction, MAX_INSTRUCTION_CHARS, blank_ok=False)
        _check_text("needs", self.needs, MAX_NEEDS_CHARS, blank_ok=True)
        if len(self.skills) > MAX_NEED_SKILLS:
            raise ValueError(f"more than {MAX_NEED_SKILLS} skills")
        for skill in self.skills:
            if len(skill) > MAX_SKILL_LEN or SKILL_PATTERN.fullmatch(skill) is None:
                raise ValueError(f"skill {skill!r} is not a normalized tag")
        if len(set(self.skills)) != len(self.skills):
            raise ValueError("skills repeat")


@message(185)
@dataclass(frozen=True, slots=True, kw_only=True)
class Plan(Message):
    """A planner's ordered steps; each step's executor sees the earlier steps' outputs."""

    steps: tuple[PlanStep, ...] = limits(max_items=MAX_PLAN_STEPS)

    def check(self) -> None:
        if not 1 <= len(self.steps) <= MAX_PLAN_STEPS:
            raise ValueError(f"a plan has 1 to {MAX_PLAN_STEPS} steps, not {len(self.steps)}")
        for n, step in enumerate(self.steps, 1):
            try:
                step.check()
            except ValueError as exc:
                raise ValueError(f"step {n}: {exc}") from None


_SKILL_REGEX = "^" + SKILL_PATTERN.pattern + "$"

#: the JSON schema planners generate under; parse_plan accepts every text it admits
PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_PLAN_STEPS,
            "items": {
                "type": "object",
                "properties": {
                    "instruction": {"type": "string", "minLength": 1,
                                    "maxLength": MAX_INSTRUCTION_CHARS},
                    "needs": {"type": "string", "maxLength": MAX_NEEDS_CHARS},
                    "skills": {
                        "type": "array",
                        "maxItems": MAX_NEED_SKILLS,
                        "items": {"type": "string", "pattern": _SKILL_REGEX,
                                  "maxLength": MAX_SKILL_LEN},
                    },
                },
                "required": ["instruction", "needs", "skills"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["steps"],
    "additionalProperties": False,
}

#: what a planner generates under: PLAN_SCHEMA narrowed (at most PLANNER_MAX_STEPS steps,
#: shorter texts, one skill a step), so the longest plan it admits fits a planner's token
#: budget and a result's answer (MAX_ANSWER_CHARS) whole; every text it admits PLAN_SCHEMA
#: admits, so parse_plan reads it
PLANNER_MAX_STEPS = 3
PLANNER_SCHEMA: dict[str, Any] = json.loads(json.dumps(PLAN_SCHEMA))
_planner_item = PLANNER_SCHEMA["properties"]["steps"]["items"]["properties"]
PLANNER_SCHEMA["properties"]["steps"]["maxItems"] = PLANNER_MAX_STEPS
_planner_item["instruction"]["maxLength"] = 100
_planner_item["needs"]["maxLength"] = 32
# one skill a step: a grammar cannot keep a list's items distinct (parse_plan refuses repeats)
_planner_item["skills"]["maxItems"] = 1
# a bounded pattern (a grammar takes a pattern over maxLength), within SKILL_PATTERN
_planner_item["skills"]["items"] = {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,19}$"}

_STEP_KEYS = frozenset(("instruction", "needs", "skills"))


def _step(n: int, raw: object) -> PlanStep:
    if not isinstance(raw, dict):
        raise InvalidPlan(f"step {n} is not a JSON object")
    missing, extra = _STEP_KEYS - raw.keys(), raw.keys() - _STEP_KEYS
    if missing or extra:
        raise InvalidPlan(f"step {n} lacks {sorted(missing)} or has unknown {sorted(extra)}")
    instruction, needs, skills = raw["instruction"], raw["needs"], raw["skills"]
    if not isinstance(instruction, str) or not isinstance(needs, str):
        raise InvalidPlan(f"step {n}: instruction and needs must be strings")
    if not isinstance(skills, list) or not all(isinstance(s, str) for s in skills):
        raise InvalidPlan(f"step {n}: skills must be a list of strings")
    return PlanStep(instruction=instruction, needs=needs, skills=tuple(skills))


def parse_plan(text: str) -> Plan:
    """The checked plan a planner's JSON ``text`` states; raises InvalidPlan naming the fault."""
    if not isinstance(text, str):
        raise InvalidPlan("a plan is JSON text")
    if len(text) > MAX_PLAN_TEXT_CHARS:
        raise InvalidPlan(f"plan text is longer than {MAX_PLAN_TEXT_CHARS} characters")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidPlan("plan text is not JSON") from None
    if not isinstance(raw, dict) or set(raw.keys()) != {"steps"}:
        raise InvalidPlan('a plan is a JSON object with the one key "steps"')
    steps = raw["steps"]
    if not isinstance(steps, list):
        raise InvalidPlan("steps is not a list")
    if not 1 <= len(steps) <= MAX_PLAN_STEPS:
        raise InvalidPlan(f"a plan has 1 to {MAX_PLAN_STEPS} steps, not {len(steps)}")
    plan = Plan(steps=tuple(_step(n, s) for n, s in enumerate(steps, 1)))
    try:
        plan.check()
    except ValueError as exc:
        raise InvalidPlan(str(exc)) from None
    return plan
