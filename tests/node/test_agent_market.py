"""Agents in the daemon's task market, without a network: the ask request's need fields, the
requester's embedding of a need, the executor's agent cards, and (integration: the real
SmolLM2) an agent with the calculator answering through its tool call."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import trio

from node.agents.calculator import Calculator
from node.agents.hosted import GENERALIST, AgentRunner, HostedAgent, hosted_cards, tool_records
from node.agents.settings import ToolSettings
from node.api.openai_request import EXTENSION_KEYS
from node.market.ask_request import AskError, NeedEmbedder, parse_ask
from node.market.requester import TasksSection, restore_event
from protocol.agents.matching import cosine, dequantize
from protocol.agents.wire import MAX_TOOL_CALLS, MAX_TOOL_OUTPUT_CHARS, card_match
from protocol.market.messages import Requirement, TaskSpec
from protocol.market.state import snapshot
from tests.protocol.market_net import MarketNet

CALC = HostedAgent(
    name="calc",
    description="Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly.",
    skills=("Arithmetic", "math"), tools=("calculator",))


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
    pytest.importorskip("torch")
    if importlib.util.find_spec("all_minilm_l6_v2") is None:
        pytest.skip("the embedder package is not installed")
    from models.embedder import default_embedder

    needs = NeedEmbedder()
    event = trio.run(needs.with_vector, ask(needs="exact arithmetic"))
    assert len(event.embedder_hash) == 32 and event.need_scale > 0
    assert trio.run(needs.with_vector, ask()) == ask()  # no text, no vector
    runner = AgentRunner((CALC, GENERALIST), ToolSettings())
    (alone,) = runner.start(solver=None)  # no llama.cpp model: the agent with tools is left out
    assert runner.problem and alone.name == "generalist"
    embedder = default_embedder()
    words = HostedAgent(name="words", description="Translates text between languages.")
    calc, words_card = hosted_cards((CALC, words), embedder.embed, embedder.hash,
                                    {"calculator": Calculator()})
    assert calc.skills == ("arithmetic", "math") and not calc.tools[0].side_effects
    (described,) = embedder.embed([CALC.description])
    assert cosine(dequantize(calc.embedding, calc.embedding_scale), described) > 0.98
    req = Requirement(model="", family="", min_context=0, needs=event.needs,
                      need_embedding=event.need_embedding, need_scale=event.need_scale,
                      embedder_hash=event.embedder_hash)
    assert card_match(calc, req) > card_match(words_card, req)  # type: ignore[operator]


@pytest.mark.integration
def test_the_calc_agent_calls_the_calculator_and_answers_verifiably() -> None:
    """The executor's path for an agent with tools, on the real default model: its tool calls
    (llama.cpp under the JSON-schema grammar), then the solver's answer reading them."""
    from models.solver import load_models_solver

    solver = load_models_solver(threads=1)
    runner = AgentRunner((CALC,), ToolSettings())
    (card,) = runner.start(solver)
    assert card.name == "calc" and not runner.problem
    task = TaskSpec(task_id=b"\7" * 32, requester="12D3KooWRequester",
                    question="What is 1234 * 5678?", answer_type="number", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=128)
    context = trio.run(runner.context, "calc", task)
    assert context is not None
    system_prompt, calls = context
    assert calls and calls[0].name == "calculator" and calls[0].output == "7006652"
    done = solver.solve(task, "", 128, 0, system_prompt=system_prompt, tool_calls=calls)
    assert done.answer.replace(",", "") == "7006652" and done.tool_calls == calls
    assert trio.run(runner.context, "generalist", task) is None  # not hosted: as today
