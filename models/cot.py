"""Chain-of-thought solving: the one function the task executor calls.

``solve(backend, problem)`` prompts the model to reason step by step and end with a line
``Final answer: <answer>``, extracts that answer (models.extract), normalizes it
(protocol.answers) and reports a confidence = exp(mean logprob) of the answer's tokens.
Without CoT (``cot=False``) the model is asked for the answer alone, in a few tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.backend import Backend, Message, SamplingParams
from models.extract import answer_confidence, extract_answer, token_char_offsets
from protocol.answers import AnswerType, normalize_answer

#: Generation budget for a chain of thought, and for a bare answer.
COT_MAX_TOKENS = 256
DIRECT_MAX_TOKENS = 24

SYSTEM_PROMPT = "You are a careful assistant who solves problems correctly."
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


def format_question(problem: Problem) -> str:
    text = problem.question.strip()
    if problem.answer_type is AnswerType.CHOICE and problem.choices:
        options = "\n".join(f"{chr(ord('A') + i)}) {c}" for i, c in enumerate(problem.choices))
        text = f"{text}\n{options}"
    return text


def build_messages(problem: Problem, cot: bool = True) -> list[Message]:
    hint = _FORMAT_HINTS[problem.answer_type]
    if cot:
        instruction = ("Think step by step, briefly. Then write the last line exactly as "
                       f"'Final answer: <answer>'. {hint}")
    else:
        instruction = f"Reply with 'Final answer: <answer>' and nothing else. {hint}"
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{format_question(problem)}\n\n{instruction}"}]


def solve(backend: Backend, problem: Problem, *, cot: bool = True, seed: int = 0,
          max_tokens: int | None = None, temperature: float = 0.0) -> Solution:
    """Answer ``problem`` with ``backend``; deterministic for a fixed seed at temperature 0."""
    budget = max_tokens or (COT_MAX_TOKENS if cot else DIRECT_MAX_TOKENS)
    gen = backend.generate(build_messages(problem, cot),
                           SamplingParams(max_tokens=budget, temperature=temperature, seed=seed))
    found = extract_answer(gen.text, problem.answer_type, problem.choices)
    offsets = token_char_offsets(gen.token_ids, backend.detokenize) if found else []
    raw = found.answer if found else ""
    return Solution(
        answer=raw,
        normalized=normalize_answer(problem.answer_type, raw, problem.choices) if found else None,
        confidence=answer_confidence(found, offsets, gen.logprobs),
        cot_text=gen.text, token_ids=gen.token_ids, prompt_token_ids=gen.prompt_token_ids,
        logprobs=gen.logprobs,
        timing={"prompt_ms": gen.prompt_ms, "generate_ms": gen.generate_ms,
                "tokens_per_s": gen.tokens_per_s},
    )
