"""Chain-of-thought solving: the one function the task executor calls.

``solve(backend, problem)`` prompts the model to reason step by step and end with a line
``Final answer: <answer>``, extracts that answer (models.extract), normalizes it
(protocol.answers) and reports a confidence = exp(mean logprob) of the answer's tokens.
Without CoT (``cot=False``) the model is asked for the answer alone, in a few tokens.

A problem's ``style`` (``protocol.market.messages.TaskSpec.style``) says how the prompt is
built (:func:`build_prompt`): ``cot`` as above (earlier conversation turns go between the
system prompt and the question), ``chat`` the conversation as it is through the model's chat
template, ``plain`` the question as raw text, ``plan`` the planner's prompt (:data:`PLANNER_PROMPT`)
and the task, its reply generated under the planner's JSON schema (models/grammar.py). For
``chat``, ``plain`` and ``plan`` the whole reply is
the answer (:func:`answer_of`) and the confidence is exp(mean logprob) of every token. The
executor (models/solver.py) and the verifier (models/checks.py) both build the prompt and
the answer with these functions, so an honest result always checks out.

An agent's answer (protocol/agents/wire.py) is built the same way from two more parts that
its signed result carries: the agent's system prompt (instead of :data:`SYSTEM_PROMPT`) and
the tool calls it made, shown to the model after the question
(``protocol.agents.wire.tool_transcript``); its answer is then
``protocol.agents.wire.restated_answer`` of what the model stated. ``plain`` tasks are raw
completions: no system prompt and no tools.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from models.backend import Backend, Message, SamplingParams
from models.extract import answer_confidence, extract_answer, token_char_offsets
from protocol.agents.plans import PLANNER_SCHEMA
from protocol.agents.wire import ToolCallRecord, restated_answer, tool_transcript
from protocol.answers import AnswerType, normalize_answer
from protocol.market.messages import MAX_ANSWER_CHARS, TaskSpec

#: Generation budget for a chain of thought, and for a bare answer.
COT_MAX_TOKENS = 256
DIRECT_MAX_TOKENS = 24

SYSTEM_PROMPT = "You are a careful assistant who solves problems correctly."
#: what a planner (style ``plan``) reads besides the task; its reply is generated under
#: protocol.agents.plans.PLANNER_SCHEMA
PLANNER_PROMPT = (
    "You are a planner. Split the task into 1 to 3 short steps that other agents will do in "
    "order; each step sees the results of the steps before it. For each step write the "
    "instruction, what the step needs (a few words) and skill tags (lower case, such as "
    "arithmetic). Reply with JSON only.")
REPLY_STYLES = ("chat", "plain", "plan")
_FORMAT_HINTS = {
    AnswerType.NUMBER: "The final answer must be a single number.",
    AnswerType.CHOICE: "The final answer must be the letter of one option.",
    AnswerType.EXACT: "The final answer must be the exact string asked for.",
    AnswerType.TEXT: "The final answer must be short.",
}


@dataclass(frozen=True, slots=True)
class Problem:
    question: str
    answer_type: AnswerType = AnswerType.TEXT
    choices: tuple[str, ...] = ()  # options of a CHOICE question, labelled A, B, C...
    style: str = "cot"  # "cot", "chat" or "plain": how the prompt is built (build_prompt)
    history: tuple[Message, ...] = ()  # conversation turns before the question, oldest first
    system_prompt: str = ""  # an agent's system prompt ("" = SYSTEM_PROMPT)
    tool_calls: tuple[ToolCallRecord, ...] = ()  # an agent's tool calls, shown after the question


@dataclass(frozen=True, slots=True)
class Solution:
    answer: str  # raw final answer as the model wrote it ("" when none was found)
    normalized: str | None  # protocol.answers.normalize_answer of it; None = unparseable
    confidence: float  # exp(mean logprob) of the answer tokens, in [0, 1]
    cot_text: str  # everything the model generated
    token_ids: tuple[int, ...]  # generated tokens
    prompt_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # per generated token
    timing: dict[str, float] = field(default_factory=dict)  # prompt_ms, generate_ms, tokens_per_s
    finish_reason: str = "stop"  # "stop" (the model ended, or a stop string) or "length"


def format_question(problem: Problem) -> str:
    text = problem.question.strip()
    if problem.answer_type is AnswerType.CHOICE and problem.choices:
        options = "\n".join(f"{chr(ord('A') + i)}) {c}" for i, c in enumerate(problem.choices))
        text = f"{text}\n{options}"
    return text


def problem_of(task: TaskSpec, system_prompt: str = "",
               tool_calls: tuple[ToolCallRecord, ...] = ()) -> Problem:
    """The problem a market task poses (to an agent with ``system_prompt`` that called
    ``tool_calls``)."""
    return Problem(question=task.question, answer_type=AnswerType(task.answer_type),
                   choices=task.choices, style=task.style,
                   history=tuple({"role": t.role, "content": t.content} for t in task.history),
                   system_prompt=system_prompt, tool_calls=tool_calls)


def _with_tools(problem: Problem, text: str) -> str:
    """``text`` (the user's turn) followed by the agent's tool calls, when it made any."""
    return f"{text}\n\n{tool_transcript(problem.tool_calls)}" if problem.tool_calls else text


def build_messages(problem: Problem, cot: bool = True) -> list[Message]:
    """The chat messages of a ``cot``-style problem."""
    hint = _FORMAT_HINTS[problem.answer_type]
    if cot:
        instruction = ("Think step by step, briefly. Then write the last line exactly as "
                       f"'Final answer: <answer>'. {hint}")
    else:
        instruction = f"Reply with 'Final answer: <answer>' and nothing else. {hint}"
    question = _with_tools(problem, format_question(problem))
    return [{"role": "system", "content": problem.system_prompt or SYSTEM_PROMPT},
            *problem.history, {"role": "user", "content": f"{question}\n\n{instruction}"}]


def build_prompt(problem: Problem, cot: bool = True) -> str | list[Message]:
    """What the model reads for ``problem``: chat messages, or raw text (``plain``)."""
    if problem.style == "plain":
        return problem.question
    if problem.style == "plan":
        return [{"role": "system", "content": problem.system_prompt or PLANNER_PROMPT},
                {"role": "user", "content": f"Task: {_with_tools(problem, problem.question)}"}]
    if problem.style == "chat":
        system: list[Message] = ([{"role": "system", "content": problem.system_prompt}]
                                 if problem.system_prompt else [])
        return [*system, *problem.history,
                {"role": "user", "content": _with_tools(problem, problem.question)}]
    return build_messages(problem, cot)


def answer_of(problem: Problem, text: str) -> str:
    """The raw answer a generated ``text`` gives ("" when a CoT states none)."""
    if problem.style in REPLY_STYLES:
        reply = text.strip()
    else:
        found = extract_answer(text, problem.answer_type, problem.choices)
        reply = found.answer if found is not None else ""
    return restated_answer(reply, problem.tool_calls)[:MAX_ANSWER_CHARS]


def solve(backend: Backend, problem: Problem, *, cot: bool = True, seed: int = 0,
          max_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
          stop: tuple[str, ...] = (), on_text: Callable[[str], None] | None = None) -> Solution:
    """Answer ``problem`` with ``backend``; for a fixed seed the same tokens on one machine.
    ``on_text`` gets the text generated so far after each token (Backend.generate)."""
    budget = max_tokens or (COT_MAX_TOKENS if cot else DIRECT_MAX_TOKENS)
    schema = json.dumps(PLANNER_SCHEMA) if problem.style == "plan" else ""
    gen = backend.generate(build_prompt(problem, cot), SamplingParams(
        max_tokens=budget, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
        json_schema=schema), on_text=on_text)
    timing = {"prompt_ms": gen.prompt_ms, "generate_ms": gen.generate_ms,
              "tokens_per_s": gen.tokens_per_s}
    common = dict(cot_text=gen.text, token_ids=gen.token_ids,
                  prompt_token_ids=gen.prompt_token_ids, logprobs=gen.logprobs, timing=timing,
                  finish_reason=gen.finish_reason)
    mean = sum(gen.logprobs) / len(gen.logprobs) if gen.logprobs else 0.0
    if problem.style in REPLY_STYLES:
        reply = answer_of(problem, gen.text)
        return Solution(answer=reply, normalized=normalize_answer(AnswerType.TEXT, reply),
                        confidence=min(1.0, math.exp(mean)), **common)  # type: ignore[arg-type]
    found = extract_answer(gen.text, problem.answer_type, problem.choices)
    if problem.tool_calls and answer_of(problem, gen.text) != (found.answer if found else ""):
        # the answer is a tool's output the model did not state: the generation's confidence
        raw = answer_of(problem, gen.text)
        return Solution(answer=raw, normalized=normalize_answer(problem.answer_type, raw,
                                                                problem.choices),
                        confidence=min(1.0, math.exp(mean)), **common)  # type: ignore[arg-type]
    offsets = token_char_offsets(gen.token_ids, backend.detokenize) if found else []
    raw = found.answer if found else ""
    return Solution(
        answer=raw,
        normalized=normalize_answer(problem.answer_type, raw, problem.choices) if found else None,
        confidence=answer_confidence(found, offsets, gen.logprobs), **common,  # type: ignore[arg-type]
    )
