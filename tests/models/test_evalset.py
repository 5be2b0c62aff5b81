from collections import Counter

from models.backend import Generation
from models.evalset import EVALSET_PATH, evaluate, generate_evalset, load_evalset, to_jsonl
from protocol.answers import AnswerType, normalize_answer


def test_shipped_file_is_the_generator_output():
    items = generate_evalset()
    assert EVALSET_PATH.read_text() == to_jsonl(items)
    assert load_evalset() == items
    assert 50 <= len(items) <= 200 and len({it.id for it in items}) == len(items)
    assert Counter(it.problem.answer_type for it in items) == {AnswerType.NUMBER: 50, AnswerType.CHOICE: 50}
    for it in items:  # expected answers are already canonical
        assert normalize_answer(it.problem.answer_type, it.answer, it.problem.choices) == it.answer


class _Oracle:
    """A fake backend that answers from a table: tests the evaluator's bookkeeping."""

    def __init__(self, answers):
        self.answers = answers

    def detokenize(self, ids):
        return "".join(chr(i) for i in ids)

    def generate(self, messages, params, on_text=None):
        question = messages[-1]["content"]
        text = f"Final answer: {next(a for q, a in self.answers if q in question)}"
        if on_text is not None:
            on_text(text)
        ids = tuple(ord(c) for c in text)
        return Generation(text=text, token_ids=ids, prompt_token_ids=(1,), logprobs=(-0.1,) * len(ids),
                          finish_reason="stop", prompt_ms=1.0, generate_ms=1.0)


def test_evaluator_counts_correct_and_unparsed():
    items = generate_evalset()[:4]
    answers = [(items[0].problem.question, items[0].answer), (items[1].problem.question, "Z"),
               (items[2].problem.question, "-1"), (items[3].problem.question, items[3].answer)]
    report = evaluate(_Oracle(answers), items)
    assert (report.correct, report.total, report.unparsed, report.accuracy) == (2, 4, 1, 0.5)
    assert 0.8 < report.mean_confidence <= 1.0
