import math

import pytest

from models.extract import answer_confidence, extract_answer, token_char_offsets
from protocol.answers import AnswerType, normalize_answer

N, C, T = AnswerType.NUMBER, AnswerType.CHOICE, AnswerType.TEXT
OPTS = ("red", "green", "blue")


@pytest.mark.parametrize("text, answer_type, choices, expected", [
    ("2 + 40 = 42.\nFinal answer: 42", N, (), "42"),
    ("Answer: 42", N, (), "42"),
    ("so the answer is **B**.", C, OPTS, "B"),
    ("Work...\n#### 3.50", N, (), "3.5"),
    ("Final answer: 7.", N, (), "7"),
    ("**Final Answer:** $12", N, (), "12"),
    ("Final answer: 3\nWait, I was wrong.\nFinal answer: 4", N, (), "4"),  # the last one wins
    ("We get \\boxed{17} in the end", N, (), "17"),
    ("first 3 then 5 then 8", N, (), "8"),  # fallback: last number
    ("no numbers here", N, (), None),
    ("", N, (), None),
    ("A) red\nB) green\nC) blue", C, OPTS, None),  # echoing the options is no choice
    ("The sky here is blue, clearly", C, OPTS, "C"),  # fallback: the one option mentioned
    ("I pick (A) because...", C, OPTS, "A"),
    ("The answer is: Paris", T, (), "paris"),
    ("Thinking...\nParis", T, (), "paris"),
])
def test_extractor_table(text, answer_type, choices, expected):
    found = extract_answer(text, answer_type, choices)
    got = normalize_answer(answer_type, found.answer, choices) if found else None
    assert got == expected
    if found:
        assert text[found.start:found.end] == found.answer


def test_confidence_is_exp_mean_logprob_of_answer_tokens():
    pieces = ["Final", " answer", ":", " 4", "2"]
    text = "".join(pieces)
    offsets = token_char_offsets(list(range(5)), lambda ids: "".join(pieces[i] for i in ids))
    assert offsets == [0, 5, 12, 13, 15, 16]
    found = extract_answer(text, N)
    lps = [-5.0, -5.0, -5.0, -0.1, -0.3]
    assert answer_confidence(found, offsets, lps) == pytest.approx(math.exp(-0.2))
    assert answer_confidence(None, offsets, lps) == 0.0
