"""Plans: the wire types, the planners' JSON schema and parse_plan on hostile text."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.agents.plans import (
    MAX_INSTRUCTION_CHARS,
    MAX_PLAN_STEPS,
    MAX_PLAN_TEXT_CHARS,
    PLAN_SCHEMA,
    InvalidPlan,
    Plan,
    PlanStep,
    parse_plan,
)
from protocol.codec import decode, encode, to_array
from protocol.errors import InvalidMessage


def step(instruction: str = "Add 3 and 4.", needs: str = "arithmetic",
         skills: list[str] | None = None) -> dict[str, object]:
    return {"instruction": instruction, "needs": needs,
            "skills": ["math"] if skills is None else skills}


def text(*steps: dict[str, object]) -> str:
    return json.dumps({"steps": list(steps)})


def test_valid_plan_parses_in_order_and_round_trips() -> None:
    plan = parse_plan(text(step("Multiply 6 by 7."), step("Subtract 2.", "", []),
                           step("State the result.", "writing", ["writing", "c++"])))
    assert [s.instruction for s in plan.steps] == [
        "Multiply 6 by 7.", "Subtract 2.", "State the result."]
    assert plan.steps[1].skills == () and plan.steps[2].skills == ("writing", "c++")
    assert decode(encode(plan), Plan) == plan


def test_largest_plan_is_accepted_and_within_the_text_bound() -> None:
    big = step("x" * MAX_INSTRUCTION_CHARS, "n" * 512, [f"s{i}" for i in range(8)])
    t = text(*[big] * MAX_PLAN_STEPS)
    assert len(t) < MAX_PLAN_TEXT_CHARS
    assert len(parse_plan(t).steps) == MAX_PLAN_STEPS


@pytest.mark.parametrize(
    "bad, why",
    [
        (text(*[step()] * (MAX_PLAN_STEPS + 1)), "1 to 8 steps, not 9"),
        (text(), "1 to 8 steps, not 0"),
        (text(step("")), "step 1: instruction is empty"),
        (text(step(), step("   \n")), "step 2: instruction is empty"),
        (text(step("x" * (MAX_INSTRUCTION_CHARS + 1))), "instruction is longer"),
        (text(step(needs="n" * 513)), "needs is longer"),
        (text(step(skills=["Math"])), "'Math' is not a normalized tag"),
        (text(step(skills=["two words"])), "is not a normalized tag"),
        (text(step(skills=["a" * 33])), "is not a normalized tag"),
        (text(step(skills=["math", "math"])), "skills repeat"),
        (text(step(skills=[f"s{i}" for i in range(9)])), "more than 8 skills"),
        (text(step(skills=[3])), "skills must be a list of strings"),
        (text(step(skills="math")), "skills must be a list of strings"),
        (text(step(instruction=5)), "must be strings"),  # type: ignore[arg-type]
        (text({"instruction": "x", "needs": ""}), "lacks ['skills']"),
        (text({**step(), "tool": "calc"}), "unknown ['tool']"),
        (text("do it"), "step 1 is not a JSON object"),
        (json.dumps({"steps": "one"}), "steps is not a list"),
        (json.dumps({"steps": [step()], "answer": 4}), 'one key "steps"'),
        (json.dumps([step()]), 'one key "steps"'),
        ("Step 1: add the numbers.", "not JSON"),
        ('{"steps": [', "not JSON"),
        ("", "not JSON"),
        ("[" * 100_000, "longer than"),
        ("[" * 8_000 + "]" * 8_000, "not JSON"),
        ('{"steps": [{"instruction": "\\ud800", "needs": "", "skills": []}]}', "lone surrogate"),
    ],
)
def test_invalid_plans_raise_invalid_plan_naming_the_fault(bad: str, why: str) -> None:
    with pytest.raises(InvalidPlan, match=why.replace("[", r"\[").replace("(", r"\(")):
        parse_plan(bad)


def test_decode_applies_the_same_checks() -> None:
    bad_step = [PlanStep.TAG, PlanStep.VERSION, "", "", []]
    frame = msgpack.packb([Plan.TAG, Plan.VERSION, [bad_step]], use_bin_type=True)
    with pytest.raises(InvalidMessage, match="instruction is empty"):
        decode(frame, Plan)
    empty = msgpack.packb([Plan.TAG, Plan.VERSION, []], use_bin_type=True)
    with pytest.raises(InvalidMessage, match="1 to 8 steps"):
        decode(empty, Plan)
    ok = Plan(steps=(PlanStep(instruction="go", needs="", skills=()),))
    assert to_array(ok)[0] == Plan.TAG


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["steps", "instruction", "needs", "skills", "x"]), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=200), _json_values.map(json.dumps)))
def test_arbitrary_text_never_raises_anything_but_invalid_plan(t: str) -> None:
    try:
        plan = parse_plan(t)
    except InvalidPlan:
        return
    assert decode(encode(plan), Plan) == plan


_skill = st.from_regex(r"[a-z0-9][a-z0-9+#._-]{0,31}", fullmatch=True)
_step = st.fixed_dictionaries({
    "instruction": st.text(min_size=1, max_size=MAX_INSTRUCTION_CHARS).filter(str.strip),
    "needs": st.text(max_size=100),
    "skills": st.lists(_skill, max_size=8, unique=True),
})


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(_step, min_size=1, max_size=MAX_PLAN_STEPS))
def test_every_schema_shaped_plan_parses(steps: list[dict[str, object]]) -> None:
    """What the grammar admits (within its bounds, valid unicode) parse_plan accepts."""
    try:
        json.dumps(steps).encode("utf-8")
        for s in steps:
            str(s["instruction"]).encode("utf-8")
            str(s["needs"]).encode("utf-8")
    except UnicodeEncodeError:
        return
    plan = parse_plan(json.dumps({"steps": steps}))
    assert len(plan.steps) == len(steps)


def test_schema_bounds_match_the_wire_bounds_and_build_a_grammar() -> None:
    items = PLAN_SCHEMA["properties"]["steps"]
    assert items["maxItems"] == MAX_PLAN_STEPS and items["minItems"] == 1
    assert items["items"]["properties"]["instruction"]["maxLength"] == MAX_INSTRUCTION_CHARS
    llama_cpp = pytest.importorskip("llama_cpp")
    grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(PLAN_SCHEMA), verbose=False)
    assert grammar is not None
