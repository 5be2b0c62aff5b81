import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.answers import MAX_RAW_CHARS, AnswerType, normalize_answer

N, C, T, E = AnswerType.NUMBER, AnswerType.CHOICE, AnswerType.TEXT, AnswerType.EXACT
ABC = ("Paris", "London", "Rome")


@pytest.mark.parametrize("answer_type, raw, choices, expected", [
    (N, "42", (), "42"), (N, "42.0", (), "42"), (N, "$1,000.00", (), "1000"), (N, "3.50", (), "3.5"),
    (N, "-0", (), "0"), (N, "\u22127", (), "-7"), (N, "3/4", (), "0.75"), (N, "2/6", (), "1/3"),
    (N, "x = 2, so y = 7.", (), "7"), (N, "**12** apples", (), "12"), (N, "none", (), None),
    (N, "1/0", (), None), (N, "9" * 100, (), None),
    (C, "B", ABC, "B"), (C, "(b)", ABC, "B"), (C, "**C**.", ABC, "C"), (C, "Option A", ABC, "A"),
    (C, "the answer is B", ABC, "B"), (C, "b) London", ABC, "B"), (C, "B) Paris", ABC, None),
    (C, "rome", ABC, "C"), (C, "D", ABC, None), (C, "a cat", ABC, None), (C, "Z", (), "Z"),
    (C, "", ABC, None),
    (T, "  Paris. ", (), "paris"), (T, "**The  Moon**!", (), "the moon"), (T, "  ", (), None),
    (E, "  `Foo Bar` ", (), "Foo Bar"), (E, "Foo Bar.", (), "Foo Bar."), (E, "", (), None),
])
def test_normalize_table(answer_type, raw, choices, expected):
    assert normalize_answer(answer_type, raw, choices) == expected


def test_too_long_is_unparseable():
    assert normalize_answer(AnswerType.TEXT, "a" * (MAX_RAW_CHARS + 1)) is None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(AnswerType)), st.text(max_size=200),
       st.lists(st.text(max_size=10), max_size=5))
def test_total_and_idempotent_on_peer_data(answer_type, raw, choices):
    out = normalize_answer(answer_type, raw, tuple(choices))
    assert out is None or isinstance(out, str)
    if out is not None and answer_type in (AnswerType.NUMBER, AnswerType.TEXT):
        assert normalize_answer(answer_type, out, tuple(choices)) == out
