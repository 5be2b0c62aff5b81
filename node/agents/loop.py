"""The bounded tool-calling loop: an agent answers a task, calling its tools on the way.

Each step asks the model (``generate(prompt, json_schema, max_tokens) -> text``) for one JSON
object under a JSON-schema grammar, so even a small model writes a well-formed step: either
``{"tool": NAME, "arguments": {...}}`` (the grammar allows only the tools this requester may
run, each with its own argument keys) or ``{"answer": "..."}``. A tool call runs through the
task's :class:`~node.agents.tools.ToolSession` (permission, budget, timeout, output cap) and
its output, or its error, is appended to the transcript; then the next step. The loop ends
with an answer, after at most ``max_calls`` calls plus one answer-only step.

Two deterministic rules help a weak model, and are facts of this loop, not of the model:

* **Steering** (:func:`forced_first_tool`): when the calculator is usable and the question
  contains an arithmetic expression, the first step's schema admits only a calculator call,
  with an expression made of digits, operators and parentheses.
* **Restating** (:func:`compose_answer`): when the model's final answer does not contain the
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

from node.agents.tools import ToolCall, ToolError, ToolSession, ToolSpec

#: generate(prompt, json_schema or None, max_tokens) -> text; blocking (run in a thread)
GenerateFn = Callable[[str, Mapping[str, Any] | None, int], str]

#: tokens of one step (a tool call or an answer)
STEP_MAX_TOKENS = 96
#: a tool output this short, on one line, is restated as the answer (see module docstring)
MAX_RESTATED_CHARS = 100
#: characters of a final answer taken from unparseable model text
MAX_ANSWER_CHARS = 2000
#: an arithmetic expression in a question: a number, an operator, a number
ARITHMETIC = re.compile(r"\d[\d.,]*\s*(?:\*\*|[-+*/x×÷^])\s*\(?\s*-?\d")
#: what a steered calculator expression may contain
EXPRESSION_PATTERN = r"^[0-9+*/(). ^-]+$"
#: the start of an answer step whose string was never closed
CUT_ANSWER = re.compile(r'\s*\{\s*"answer"\s*:\s*"((?:[^"\\]|\\.)*)$', re.DOTALL)
_SIMPLE_TYPES = ("string", "integer", "number", "boolean")


def _argument_schema(spec: ToolSpec) -> dict[str, Any]:
    """The grammar's schema of a tool's arguments: its simple-typed properties and required
    keys (no length bounds: llama.cpp's converter unrolls them; ``max_tokens`` bounds a step)."""
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
    """The schema of the next step: a call of one of ``specs`` or an answer; only a
    calculator call when ``forced`` is "calculator"; only an answer when ``specs`` is empty."""
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
    """The tool the first step must call: the calculator for an arithmetic question."""
    if any(s.name == "calculator" for s in specs) and ARITHMETIC.search(question):
        return "calculator"
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


def compose_answer(model_answer: str, calls: list[ToolCall], cut: bool = False) -> str:
    """The model's answer, or the last successful call's short output when the answer does
    not contain it or was cut at ``max_tokens`` (see module docstring)."""
    last = next((c for c in reversed(calls) if c.ok), None)
    if last is None:
        return model_answer
    output = last.output.strip()
    if output and "\n" not in output and len(output) <= MAX_RESTATED_CHARS and \
            (cut or output not in model_answer):
        return output
    return model_answer


async def answer_with_tools(generate: GenerateFn, *, system_prompt: str, question: str,
                            session: ToolSession, max_tokens: int = STEP_MAX_TOKENS
                            ) -> tuple[str, list[dict[str, Any]]]:
    """(answer text, the tool calls as ``{name, arguments, output}``) for ``question``.

    At most ``max_calls + 2`` model steps: each tool call or unreadable reply takes one, and
    when the budget is spent (or no tool is usable) one answer-only step ends the loop.
    """
    specs = session.usable_specs()
    transcript: list[str] = []
    forced = forced_first_tool(question, specs)
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
            return compose_answer(step["answer"], session.calls, "cut" in step), _calls(session)
        else:
            await _run_step(session, step, transcript)
    prompt = build_prompt(system_prompt, question, specs, transcript, answer_only=True)
    text = await trio.to_thread.run_sync(generate, prompt, ANSWER_SCHEMA, max_tokens)
    step = parse_step(text)
    if step is None or "answer" not in step:
        step = {"answer": text.strip()[:MAX_ANSWER_CHARS], "cut": True}
    return compose_answer(step["answer"], session.calls, "cut" in step), _calls(session)


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
