"""Agents in the daemon's task market, without a network: the ask request's need fields, the
requester's embedding of a need, the executor's agent cards, and (integration: the real
SmolLM2) an agent with the calculator answering through its tool call."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from node.agents.cards import build_card, builtin_tool_info
from node.agents.config import GENERALIST, AgentSpec
from node.agents.hosted import AgentRunner, builtin_kit, tool_allowance_ms, tool_records
from node.agents.tools import ToolLimits, ToolPolicy, ToolSpec
from node.api.openai_request import EXTENSION_KEYS
from node.config import load_config
from node.market.ask_request import AskError, NeedEmbedder, parse_ask
from node.market.requester import TasksSection, restore_event
from protocol.agents.wire import MAX_TOOL_CALLS, MAX_TOOL_OUTPUT_CHARS, card_match
from protocol.market.messages import Requirement, TaskSpec
from protocol.market.state import snapshot
from tests.protocol.agent_fixtures import card
from tests.protocol.market_net import MODEL, MarketNet, ident

CALC = AgentSpec(
    name="calc",
    description="Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly.",
    skills=("arithmetic", "math"), tools=("calculator",))
TASK = TaskSpec(task_id=b"\7" * 32, requester="12D3KooWRequester",
                question="What is 1234 * 5678?", answer_type="number", choices=(),
                requirement=Requirement(model="", family="", min_context=0), k=1,
                max_price=1.0, max_tokens=128)


def ask(**request: Any) -> Any:
    return parse_ask({"question": "What is 1234 * 5678?", **request}, TasksSection(),
                     b"\1" * 32)


def test_an_ask_names_its_need_as_text_tags_and_agent() -> None:
    event = ask(needs=" exact arithmetic ", skills="Math, arithmetic,math", agent="calc")
    assert (event.needs, event.skills, event.agent) == ("exact arithmetic",
                                                        ("math", "arithmetic"), "calc")
    assert ask(skills=["math"]).skills == ("math",)
    plain = ask()
    assert (plain.needs, plain.skills, plain.agent) == ("", (), "")
    assert {"needs", "skills", "agent"} <= set(EXTENSION_KEYS)


@pytest.mark.parametrize("field, value", [
    ("needs", "x" * 513), ("needs", 3), ("skills", ["no spaces here"]), ("skills", [1]),
    ("skills", [f"s{i}" for i in range(9)]), ("agent", "two words"), ("agent", ["calc"]),
])
def test_a_bad_need_is_refused_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(AskError) as refused:
        ask(**{field: value})
    assert refused.value.param == field


def test_a_stored_task_keeps_its_need_across_a_restart() -> None:
    net = MarketNet(0)
    tid = net.submit(k=1, needs="sums", skills=("math",), agent="calc",
                     need_embedding=b"\x01\x02", need_scale=0.5, embedder_hash=bytes(32))
    snap = snapshot(net.auction.tasks[tid]).to_dict()
    assert snap["requested_agent"] == "calc" and snap["agent"] is None
    restored = restore_event(snap, net.rq, 10_000)
    assert restored.spec.requirement == net.auction.tasks[tid].spec.requirement


def test_tool_records_are_bounded_to_the_wire() -> None:
    calls = [{"name": "calculator", "arguments": {"expression": "1+1" * 600}, "output": "2"},
             {"name": "docsearch", "arguments": {"q": "x"}, "output": "y" * 10_000}] * 6
    records = tool_records(calls)
    assert len(records) == MAX_TOOL_CALLS
    assert records[0].arguments == "{}" and records[1].arguments == '{"q":"x"}'
    assert len(records[1].output) == MAX_TOOL_OUTPUT_CHARS


def test_the_requester_embeds_the_need_and_the_calc_card_fits_it_best() -> None:
    if importlib.util.find_spec("all_minilm_l6_v2") is None:
        pytest.skip("the embedder package is not installed")
    needs = NeedEmbedder()
    event = trio.run(needs.with_vector, ask(needs="exact arithmetic"))
    assert len(event.embedder_hash) == 32 and event.need_scale > 0
    assert trio.run(needs.with_vector, ask()) == ask()  # no text, no vector
    embedder = needs.embedder()
    vectors = embedder.embed([CALC.description, GENERALIST.description])
    calc, generalist = (build_card(a, v, embedder.hash, None, 0.0, builtin_tool_info)
                        for a, v in zip((CALC, GENERALIST), vectors, strict=True))
    req = Requirement(model="", family="", min_context=0, needs=event.needs,
                      need_embedding=event.need_embedding, need_scale=event.need_scale,
                      embedder_hash=event.embedder_hash)
    assert card_match(calc, req) > card_match(generalist, req) + 0.3  # type: ignore[operator]


def test_agents_with_tools_do_not_bid_without_a_llama_cpp_solver() -> None:
    runner = AgentRunner()
    runner.start(solver=None)
    cards = (card("calc"), card("generalist", tools=()))
    assert [c.name for c in runner.use((CALC, GENERALIST), cards, builtin_kit)] == \
        ["generalist"]
    assert "calc" in runner.problem
    assert trio.run(runner.context, "generalist", TASK) is None  # plain: answers as today


class NoteWriter:
    """A side-effecting tool that records every run."""

    spec = ToolSpec(name="notes.write", description="Write a note.", side_effects=True,
                    parameters={"properties": {"text": {"type": "string"}},
                                "required": ["text"]})

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        self.runs.append(arguments)
        return "written"


class Script:
    """A model double for the tool steps: the scripted replies, in order."""

    def __init__(self, *replies: object) -> None:
        self.replies = [json.dumps(r) for r in replies]

    def __call__(self, prompt: str, schema: Any, max_tokens: int) -> str:
        return self.replies.pop(0)


@pytest.mark.parametrize("allowed", [False, True])
def test_a_side_effecting_tool_runs_only_for_requesters_the_operator_allows(
        tmp_path: Path, allowed: bool) -> None:
    """The operator's [tools] table (node.toml, through the config) decides; the executor's
    session names the task's requester."""
    allow = f'allow = ["{ident(1).peer_id}"]' if allowed else "allow = []"
    (tmp_path / "node.toml").write_text(f'[tools."notes.write"]\n{allow}\n')
    settings = load_config({"data_dir": tmp_path}, env={}).tools
    writer = NoteWriter()
    runner = AgentRunner()
    runner.generate = Script({"tool": "notes.write", "arguments": {"text": "hi"}},
                             {"answer": "done"})
    notes = AgentSpec(name="notes", description="Keeps notes.", tools=("notes.write",))
    kit = lambda: ({"notes.write": writer}, settings.policy, settings.limits)  # noqa: E731
    assert runner.use((notes,), (card("notes", tools=()),), kit)
    task = dataclasses.replace(TASK, requester=ident(1).peer_id, question="Note: hi")
    context = trio.run(runner.context, "notes", task)
    assert context is not None
    if allowed:
        assert [c.output for c in context[1]] == ["written"] and writer.runs == [{"text": "hi"}]
    else:  # never offered to the model, never run: the agent's only tool, refused on the record
        (refused,) = context[1]
        assert refused.name == "notes.write" and refused.arguments == "{}"
        assert refused.output == ("error: tool 'notes.write' has side effects and the operator "
                                  f"has not allowed requester '{ident(1).peer_id}' to run it")
        assert writer.runs == []


def test_an_agents_bids_count_its_tools_at_their_limits() -> None:
    runner = AgentRunner()
    limits = ToolLimits(max_calls=2, call_timeout_s=5.0)
    runner.use((CALC, GENERALIST), (card("calc"), card("generalist", tools=())),
               lambda: ({}, ToolPolicy(), limits))
    fast = dataclasses.replace(MODEL, tokens_per_s=96.0)
    # two calls at 5 s, and four steps of STEP_MAX_TOKENS (96) at 96 tokens/s
    assert runner.tool_ms((fast,)) == (("calc", 14_000),)
    assert tool_allowance_ms(limits, 48.0) == 18_000


@pytest.mark.integration
def test_the_calc_agent_calls_the_calculator_and_answers_verifiably() -> None:
    """The executor's path for an agent with tools, on the real default model: its tool calls
    (llama.cpp under the JSON-schema grammar), then the solver's answer reading them."""
    from models.solver import load_models_solver

    solver = load_models_solver(threads=1)
    runner = AgentRunner()
    runner.start(solver)
    (calc,) = runner.use((CALC,), (card("calc"),), builtin_kit)
    assert calc.name == "calc" and not runner.problem
    context = trio.run(runner.context, "calc", TASK)
    assert context is not None
    system_prompt, calls = context
    assert calls and calls[0].name == "calculator" and calls[0].output == "7006652"
    done = solver.solve(TASK, "", 128, 0, system_prompt=system_prompt, tool_calls=calls)
    assert done.answer.replace(",", "") == "7006652" and done.tool_calls == calls
    assert trio.run(runner.context, "generalist", TASK) is None  # not hosted: as today
