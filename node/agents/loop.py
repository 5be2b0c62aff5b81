"""The bounded tool-calling loop: an agent answers a task, calling its tools on the way.

Each step asks the model (``generate(prompt, json_schema, max_tokens) -> text``) for one JSON
object under a JSON-schema grammar, so even a small model writes a well-formed step: either
``{"tool": NAME, "arguments": {...}}`` (the grammar allows only the tools this requester may
run, each with its own argument keys) or ``{"answer": "..."}``. A tool call runs through the
task's :class:`~node.agents.tools.ToolSession` (permission, budget, timeout, output cap) and
its output, or its error, is appended to the transcript; then the next step. The loop ends
with an answer, after at most ``max_calls`` calls plus one answer-only step.

Two deterministic rules help a weak model, and are facts of this loop, not of the model:

* **Steering** (:func:`forced_first_tool`): the first step must call a tool when
  (i) the agent has the calculator and the question contains an arithmetic expression: the
  schema admits only a calculator call, with an expression made of digits, operators and
  parentheses; or (ii) the agent has exactly one tool, not the calculator: an agent the
  operator declared with a single tool is that tool's agent (a search agent, a note-taker), so
  every task it takes starts with that tool, whose arguments the model writes under the
  tool's own schema. The calculator is the exception because whether it applies can be read
  off the question. A forced tool the requester may not run is not offered to the model: the
  loop calls it with no arguments, the session refuses it (the permission comes before the
  arguments) and that refusal is the task's first recorded call, so the result shows why the
  agent did not use its tool.
* **Restating** (``protocol.agents.wire.restated_answer``, the rule the executor's final
  answer and every verifier apply too): when the model's final answer does not contain the
  output of the last successful call, or was not a finished JSON answer (cut at
  ``max_tokens``, or no JSON at all), and that output is one short line (a calculator's
  result), the answer is that output. So the answer to "What is 1234 * 5678?" is the
  calculator's "7006652" even when a 135M model fails to copy it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import trio

from node.agents.tools import ToolError, ToolSession, ToolSpec
from protocol.agents.wire import restated_answer

#: generate(prompt, json_schema or None, max_tokens) -> text; blocking (run in a thread)
GenerateFn = Callable[[str, Mapping[str, Any] | None, int], str]

#: tokens of one step (a tool call or an answer)
STEP_MAX_TOKENS = 96
#: characters of a final answer taken from unparseable model text
MAX_ANSWER_CHARS = 2000
#: an arithmetic expression in a question: a number, an operator, a number
ARITHMETIC = re.compile(r"\d[\d.,]*\s*(?:\*\*|[-+*/x×÷^])\s*\(?\s*-?\d")
#: what a steered calculator expression may contain
EXPRESSION_PATTERN = r"^[0-9+*/(). ^-]+$"
#: the start of an answer step whose string was never closed
CUT_ANSWER = re.compile(r'\s*\{\s*"answer"\s*:\s*"((?:[^"\\]|\\.)*)$', re.DOTALL)
_SIMPLE_TYPES = ("string", "integer", "number", "boolean")
#: the arguments schema of a tool that declares none: only the empty object
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {},
                                "additionalProperties": False}


def _argument_schema(spec: ToolSpec) -> dict[str, Any]:
    """The grammar's schema of a tool's arguments: its simple-typed properties and required
    keys (no length bounds: llama.cpp's converter unrolls them; ``max_tokens`` bounds a step)."""
    declared = spec.parameters.get("properties", {})
    if isinstance(declared, Mapping) and not declared:
        return NO_ARGUMENTS  # a tool that takes no arguments gets exactly {}
    properties = {}
    for key, rule in spec.parameters.get("properties", {}).items():
        if isinstance(rule, Mapping) and rule.get("type") in _SIMPLE_TYPES:
            properties[key] = {"type": rule["type"]}
    required = [k for k in spec.parameters.get("required", ()) if k in properties]
    if not properties:
        return {"type": "object"}
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def _call_schema(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"tool": {"const": name}, "arguments": arguments},
            "required": ["tool", "arguments"], "additionalProperties": False}


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object", "properties": {"answer": {"type": "string"}},
    "required": ["answer"], "additionalProperties": False}


def step_schema(specs: list[ToolSpec], forced: str | None) -> dict[str, Any]:
    """The schema of the next step: a call of one of ``specs`` or an answer; only a call of
    ``forced`` when it is set (a calculator's expression limited to arithmetic); only an
    answer when ``specs`` is empty."""
    if forced is not None:
        spec = next(s for s in specs if s.name == forced)
        arguments = _argument_schema(spec)
        if forced == "calculator":
            arguments = {"type": "object",
                         "properties": {"expression": {"type": "string",
                                                       "pattern": EXPRESSION_PATTERN}},
                         "required": ["expression"], "additionalProperties": False}
        return _call_schema(spec.name, arguments)
    if not specs:
        return ANSWER_SCHEMA
    return {"anyOf": [*(_call_schema(s.name, _argument_schema(s)) for s in specs),
                      ANSWER_SCHEMA]}


def forced_first_tool(question: str, specs: list[ToolSpec]) -> str | None:
    """The tool the first step must call (see the module docstring), from all the agent's
    tools ``specs``: the calculator for an arithmetic question, an agent's only tool."""
    if any(s.name == "calculator" for s in specs) and ARITHMETIC.search(question):
        return "calculator"
    if len(specs) == 1 and specs[0].name != "calculator":
        return specs[0].name
    return None


def build_prompt(system_prompt: str, question: str, specs: list[ToolSpec],
                 transcript: list[str], answer_only: bool) -> str:
    lines = [system_prompt.strip()] if system_prompt.strip() else []
    if specs:
        lines.append("You can call these tools:")
        lines += [f"- {s.name}: {s.description} Arguments: "
                  f"{json.dumps(_argument_schema(s).get('properties', {}))}" for s in specs]
    lines += ["", f"Question: {question}", *transcript, ""]
    if answer_only:
        lines.append('Reply with {"answer": "..."}: the final answer to the question.')
    else:
        lines.append('Reply with one JSON object: {"tool": "<name>", "arguments": {...}} to '
                     'call a tool, or {"answer": "..."} with the final answer.')
    return "\n".join(lines)


def parse_step(text: str) -> dict[str, Any] | None:
    """The step object the model wrote, or None when it is not one."""
    try:
        step, _ = json.JSONDecoder().raw_decode(text.strip())
    except ValueError:
        cut = CUT_ANSWER.match(text)
        if cut is None:
            return None
        # a reply cut at max_tokens inside its answer string keeps what it wrote
        return {"answer": cut.group(1).replace('\\"', '"').strip()[:MAX_ANSWER_CHARS],
                "cut": True}
    if not isinstance(step, dict):
        return None
    if isinstance(step.get("answer"), str):
        return step
    if isinstance(step.get("tool"), str) and isinstance(step.get("arguments", {}), dict):
        return step
    return None


async def answer_with_tools(generate: GenerateFn, *, system_prompt: str, question: str,
                            session: ToolSession, max_tokens: int = STEP_MAX_TOKENS
                            ) -> tuple[str, list[dict[str, Any]]]:
    """(answer text, the tool calls as ``{name, arguments, output}``) for ``question``.

    At most ``max_calls + 2`` model steps: each tool call or unreadable reply takes one, and
    when the budget is spent (or no tool is usable) one answer-only step ends the loop.
    """
    specs = session.usable_specs()
    transcript: list[str] = []
    forced = forced_first_tool(question, session.registry.specs)
    if forced is not None and forced not in {s.name for s in specs}:
        # the requester may not run it: the session refuses it, on the record
        await _run_step(session, {"tool": forced, "arguments": {}}, transcript)
        forced = None
    for _ in range(session.limits.max_calls + 1):
        if session.remaining <= 0 or not specs:
            break
        prompt = build_prompt(system_prompt, question, specs, transcript, answer_only=False)
        text = await trio.to_thread.run_sync(generate, prompt, step_schema(specs, forced),
                                             max_tokens)
        forced = None
        step = parse_step(text)
        if step is None:
            transcript.append("(that reply was not a JSON step)")
        elif "answer" in step:
            answer = restated_answer(step["answer"], session.calls, cut="cut" in step)
            return answer, _calls(session)
        else:
            await _run_step(session, step, transcript)
    prompt = build_prompt(system_prompt, question, specs, transcript, answer_only=True)
    text = await trio.to_thread.run_sync(generate, prompt, ANSWER_SCHEMA, max_tokens)
    step = parse_step(text)
    if step is None or "answer" not in step:
        step = {"answer": text.strip()[:MAX_ANSWER_CHARS], "cut": True}
    return restated_answer(step["answer"], session.calls, cut="cut" in step), _calls(session)


async def _run_step(session: ToolSession, step: dict[str, Any], transcript: list[str]) -> None:
    n = len(session.calls) + 1
    arguments = step.get("arguments", {})
    transcript.append(f"Tool call {n}: {step['tool']} {json.dumps(arguments)}")
    try:
        output = await session.call(step["tool"], arguments)
    except ToolError as exc:
        output = f"error: {exc}"
    transcript.append(f"Tool output {n}: {output}")


def _calls(session: ToolSession) -> list[dict[str, Any]]:
    return [c.as_json() for c in session.calls]
