"""The held-out split (a fixed rule on the prompt's text, disjoint from what training can
name), the arithmetic environment's reward, and the Wilson interval."""

from __future__ import annotations

import pytest

from models.rl.arith_env import ANSWER_REWARD, FORMAT_REWARD, ArithmeticEnvironment, questions
from models.rl.env import (
    HELDOUT_EVERY,
    Environment,
    heldout_every,
    is_heldout,
    load_environment,
    load_full_environment,
    load_heldout,
    split,
)
from models.stats import wilson_interval


class Listed:
    """An environment of given prompt texts (their order is the test's)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    @property
    def size(self) -> int:
        return len(self.texts)

    def prompt(self, index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.texts[index]}]

    def reward(self, prompt: int, completion: str) -> float:
        return float(completion == self.texts[prompt])


@pytest.mark.parametrize("spec", ["arith", "evalset"])
def test_training_and_heldout_views_partition_the_prompts(spec: str) -> None:
    full, train, held = load_full_environment(spec), load_environment(spec), load_heldout(spec)
    assert isinstance(train, Environment) and isinstance(held, Environment)
    texts = lambda env: [str(env.prompt(i)) for i in range(env.size)]  # noqa: E731
    assert train.size + held.size == full.size
    assert not set(texts(train)) & set(texts(held))
    assert sorted(texts(train) + texts(held)) == sorted(texts(full))
    # about one in the environment's share, not a degenerate split
    every = heldout_every(full)
    assert every == (2 if spec == "arith" else HELDOUT_EVERY)
    assert all(is_heldout(held.prompt(i), every) for i in range(held.size))
    assert 0.4 / every < held.size / full.size < 2.0 / every
    with pytest.raises(IndexError):
        train.prompt(train.size)


def test_the_split_follows_the_text_not_the_order() -> None:
    texts = [f"question {i}" for i in range(200)]
    _, held = split(Listed(texts))
    _, held_reversed = split(Listed(texts[::-1]))
    as_set = lambda env: {env.prompt(i)[0]["content"] for i in range(env.size)}  # noqa: E731
    assert as_set(held) == as_set(held_reversed)
    # the views map rewards and correctness through to the underlying prompt
    text = held.prompt(0)[0]["content"]
    assert held.reward(0, text) == 1.0 and held.correct(0, text) and not held.correct(0, "no")


def test_an_environment_sets_its_held_out_share() -> None:
    texts = [f"question {i}" for i in range(400)]
    env = Listed(texts)
    _, default = split(env)
    env.heldout_every = 2  # type: ignore[attr-defined]
    _, halves = split(env)
    assert 0.6 / HELDOUT_EVERY < default.size / 400 < 1.4 / HELDOUT_EVERY
    assert 0.6 / 2 < halves.size / 400 < 1.4 / 2
    # an integer rule: every prompt divisible by 2 * k is also divisible by 2
    fifths = {p["content"] for i in range(default.size) for p in default.prompt(i)}
    tenths = [t for t in texts if is_heldout([{"role": "user", "content": t}], 10)]
    assert set(tenths) <= fifths
    for bad in (1, 0, 2.5, True, "3"):
        env.heldout_every = bad  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="heldout_every"):
            split(env)


def test_a_split_with_an_empty_side_is_refused() -> None:
    train_only = [t for t in (f"q{i}" for i in range(100))
                  if not is_heldout([{"role": "user", "content": t}])][:3]
    with pytest.raises(ValueError, match="both need at least one"):
        split(Listed(train_only))


def test_the_arithmetic_environment_rewards_format_then_answer() -> None:
    env = ArithmeticEnvironment()
    assert env.size == len(set(questions())) == 21 * 21 + 21 * 22 // 2
    right = env.answer(3)
    assert env.reward(3, f"Final answer: {right}") == FORMAT_REWARD + ANSWER_REWARD
    for formed in (f" {right}.\n", f"The answer is {right}.", f"answer:{right}",
                   f"1 + 1 = 2\n\nThe answer is: {right}", f"working\nFinal answer: {right}"):
        assert env.reward(3, formed) == FORMAT_REWARD + ANSWER_REWARD and env.correct(3, formed)
    assert env.reward(3, f"Final answer: {right + 1}") == FORMAT_REWARD
    assert not env.correct(3, f"Final answer: {right + 1}")
    for sloppy in (f"The answer is {right} apples", f"3 + 4 = {right}", f"{right} {right}",
                   f"one\ntwo\nFinal answer: {right}", f"Final answer: {right}\nbecause", ""):
        assert env.reward(3, sloppy) == 0.0 and not env.correct(3, sloppy)
    question = env.prompt(3)[0]["content"]
    a, op, b = question.removeprefix("What is ").split("?")[0].split()
    assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == right >= 0
    with pytest.raises(IndexError):
        env.answer(env.size)


#: Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3
@pytest.mark.parametrize("k, n, low, high", [
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_interval_matches_published_values(k: int, n: int, low: float, high: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_refuses_impossible_counts() -> None:
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError):
            wilson_interval(k, n)
