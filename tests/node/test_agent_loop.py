"""The bounded tool-calling loop (node/agents/loop.py): with a scripted model, and with the
embedded SmolLM2-135M on llama.cpp under a JSON-schema grammar (integration)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import trio

from node.agents.calculator import Calculator
from node.agents.loop import (
    ANSWER_SCHEMA,
    NO_ARGUMENTS,
    answer_with_tools,
    forced_first_tool,
    parse_step,
    step_schema,
)
from node.agents.tools import ToolLimits, ToolPolicy, ToolRegistry, ToolSession, ToolSpec

SYSTEM = "You are calc, an agent for exact arithmetic."
WRITE = ToolSpec(name="notes.write", description="Write.", side_effects=True,
                 parameters={"properties": {"text": {"type": "string"}}, "required": ["text"]})


class Script:
    """A model double: answers the scripted replies in order, records what it was asked."""

    def __init__(self, *replies: object) -> None:
        self.replies = [r if isinstance(r, str) else json.dumps(r) for r in replies]
        self.asked: list[tuple[str, Mapping[str, Any] | None, int]] = []

    def __call__(self, prompt: str, schema: Mapping[str, Any] | None, max_tokens: int) -> str:
        self.asked.append((prompt, schema, max_tokens))
        return self.replies.pop(0)


class Writer:
    spec = WRITE

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        raise AssertionError("a refused tool must never run")


def _run(model: Script, question: str, *tools: Any, max_calls: int = 4
         ) -> tuple[str, list[dict[str, Any]]]:
    session = ToolSession(ToolRegistry(tools or [Calculator()]), ToolPolicy(),
                          ToolLimits(max_calls=max_calls), "12D3KooWRequester")
    return trio.run(lambda: answer_with_tools(model, system_prompt=SYSTEM, question=question,
                                              session=session))


def test_a_tool_call_then_an_answer() -> None:
    model = Script({"tool": "calculator", "arguments": {"expression": "1234 * 5678"}},
                   {"answer": "1234 * 5678 = 7006652"})
    answer, calls = _run(model, "What is 1234 * 5678?")
    assert answer == "1234 * 5678 = 7006652"
    assert calls == [{"name": "calculator", "arguments": {"expression": "1234 * 5678"},
                      "output": "7006652"}]
    first_schema = model.asked[0][1]
    assert first_schema is not None and first_schema["properties"]["tool"] == \
        {"const": "calculator"}  # steered: only a calculator call
    assert "Tool output 1: 7006652" in model.asked[1][0]
    assert "anyOf" in (model.asked[1][1] or {})


def test_the_answer_restates_a_result_the_model_failed_to_copy() -> None:
    model = Script({"tool": "calculator", "arguments": {"expression": "6*7"}},
                   '{"answer": "the result is 6 times 7 which is 6 times 7 which')
    assert _run(model, "What is 6*7?")[0] == "42"
    model = Script({"tool": "calculator", "arguments": {"expression": "6*7"}},
                   {"answer": "about 40"})
    assert _run(model, "What is 6*7?")[0] == "42"


def test_max_calls_reached_ends_with_an_answer_only_step() -> None:
    call = {"tool": "calculator", "arguments": {"expression": "1+1"}}
    model = Script(call, call, {"answer": "2"})
    answer, calls = _run(model, "What is 1+1?", max_calls=2)
    assert answer == "2" and len(calls) == 2
    assert model.asked[-1][1] == ANSWER_SCHEMA and not model.replies


def test_refusals_and_failures_reach_the_transcript() -> None:
    model = Script({"tool": "notes.write", "arguments": {"text": "x"}},
                   {"tool": "calculator", "arguments": {"expression": "1/0"}},
                   "not json at all", {"answer": "cannot"})
    answer, calls = _run(model, "Write a note", Writer(), Calculator())
    assert answer == "cannot"
    assert calls[0]["output"].startswith("error: tool 'notes.write' has side effects and the "
                                          "operator has not allowed")
    assert calls[1]["output"] == "error: calculator: division by zero at position 1"
    assert "(that reply was not a JSON step)" in model.asked[3][0]


def test_a_tool_the_requester_may_not_run_is_not_offered() -> None:
    session = ToolSession(ToolRegistry([Writer(), Calculator()]), ToolPolicy(), ToolLimits(),
                          "12D3KooWRequester")
    schema = step_schema(session.usable_specs(), None)
    assert [alt.get("properties", {}).get("tool") for alt in schema["anyOf"]] == \
        [{"const": "calculator"}, None]


class Pinger:
    """A read-only tool with no arguments."""

    spec = ToolSpec(name="net.ping", description="Ping.", side_effects=False,
                    parameters={"type": "object", "properties": {}})

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        assert arguments == {}
        return "pong"


def test_an_agents_only_tool_is_its_first_step() -> None:
    model = Script({"tool": "net.ping", "arguments": {}}, {"answer": "it answered"})
    answer, calls = _run(model, "Is the host up?", Pinger())
    assert calls == [{"name": "net.ping", "arguments": {}, "output": "pong"}]
    assert answer == "pong"  # restated: the answer does not contain the tool's short output
    assert model.asked[0][1] == {"type": "object",
                                 "properties": {"tool": {"const": "net.ping"},
                                                "arguments": NO_ARGUMENTS},
                                 "required": ["tool", "arguments"],
                                 "additionalProperties": False}


def test_an_only_tool_the_requester_may_not_run_is_refused_on_the_record() -> None:
    model = Script({"answer": "I could not write it"})
    answer, calls = _run(model, "Note that the build passed", Writer())
    assert calls == [{"name": "notes.write", "arguments": {}, "output": (
        "error: tool 'notes.write' has side effects and the operator has not allowed "
        "requester '12D3KooWRequester' to run it")}]
    # the model was asked once, for the answer only, and saw the refusal
    assert len(model.asked) == 1 and model.asked[0][1] == ANSWER_SCHEMA
    assert "Tool output 1: error: tool 'notes.write' has side effects" in model.asked[0][0]
    assert answer == "I could not write it"


def test_steering_and_parsing_rules() -> None:
    specs = [Calculator.spec]
    assert forced_first_tool("What is 1234 * 5678?", specs) == "calculator"
    assert forced_first_tool("what is 3x4", specs) == "calculator"
    assert forced_first_tool("Who wrote Hamlet?", specs) is None
    assert forced_first_tool("What is 2+2?", []) is None
    assert forced_first_tool("Is it up?", [Pinger.spec]) == "net.ping"  # an only tool
    assert forced_first_tool("Is it up?", [Pinger.spec, WRITE]) is None
    assert forced_first_tool("What is 2+2?", [Pinger.spec, Calculator.spec]) == "calculator"
    assert parse_step('{"answer": "4"}') == {"answer": "4"}
    assert parse_step('{"tool": "calculator", "arguments": {}} ') is not None
    assert parse_step('{"tool": 3}') is None and parse_step("[1]") is None


@pytest.mark.integration
def test_smollm2_calls_the_calculator_and_answers() -> None:
    from llama_cpp import Llama

    from models.registry import default_model
    from node.agents.generation import llama_generate

    llm = Llama(model_path=str(default_model().path), n_ctx=2048, n_threads=1, seed=0,
                verbose=False)
    generate = llama_generate(llm)
    replies: list[str] = []

    def recorded(prompt: str, schema: Mapping[str, Any] | None, max_tokens: int) -> str:
        replies.append(generate(prompt, schema, max_tokens))
        return replies[-1]

    session = ToolSession(ToolRegistry([Calculator()]), ToolPolicy(), ToolLimits(),
                          "12D3KooWRequester")
    answer, calls = trio.run(lambda: answer_with_tools(
        recorded, system_prompt=SYSTEM, question="What is 1234 * 5678?", session=session))
    first = json.loads(replies[0])  # the model's own first step, well-formed under the grammar
    assert first["tool"] == "calculator"
    assert calls[0]["name"] == "calculator" and calls[0]["output"] == "7006652"
    assert "7006652" in answer
