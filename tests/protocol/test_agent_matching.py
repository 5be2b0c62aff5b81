"""The one match rule, Symphony-Coord's screening, and the card vectors' quantization."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.agents.matching import (
    LEGACY_MATCH,
    MIN_SELF_COSINE,
    SCREEN_TOP_L,
    W_SKILLS,
    Screened,
    cosine,
    dequantize,
    match_score,
    quantize,
    screen,
    screening_score,
    skill_overlap,
    vector_agrees,
)

X, Y = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]
DIAG = [1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]


@pytest.mark.parametrize(
    "need_vector, need_tags, card_vector, card_skills, expected",
    [
        # neither text nor tags: every agent alike, as asks were before agents
        (None, (), X, ("math",), LEGACY_MATCH),
        (None, (), None, (), LEGACY_MATCH),
        (None, ("  ",), X, ("math",), LEGACY_MATCH),
        # tags only: the share of needed tags the card lists
        (None, ("math",), None, ("math", "arithmetic"), 1.0),
        (None, ("math", "translation"), X, ("math",), 0.5),
        (None, ("Math", "math "), X, ("math",), 1.0),
        (None, ("cooking",), X, ("math",), 0.0),
        # text only: cosine, negatives count as unrelated
        (X, (), X, ("math",), 1.0),
        (X, (), DIAG, (), 1 / math.sqrt(2)),
        (X, (), Y, (), 0.0),
        (X, (), [-1.0, 0.0, 0.0], (), 0.0),
        (X, (), None, ("math",), 0.0),
        # both: the documented weighted sum
        (X, ("math",), DIAG, ("math",), W_SKILLS + (1 - W_SKILLS) / math.sqrt(2)),
        (X, ("math",), Y, ("math",), W_SKILLS),
        (X, ("math",), X, (), 1 - W_SKILLS),
        (X, ("math",), None, ("math",), W_SKILLS),
    ],
)
def test_match_score_table(need_vector: list[float] | None, need_tags: tuple[str, ...],
                           card_vector: list[float] | None, card_skills: tuple[str, ...],
                           expected: float) -> None:
    got = match_score(need_vector, need_tags, card_vector, card_skills)
    assert got == pytest.approx(expected)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.one_of(st.none(), st.lists(st.floats(-1e3, 1e3), min_size=4, max_size=4)),
    st.lists(st.sampled_from(["a", "b", "c", "D", ""]), max_size=4),
    st.one_of(st.none(), st.lists(st.floats(-1e3, 1e3), min_size=4, max_size=4)),
    st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=4),
)
def test_match_score_is_always_in_the_unit_interval(
        nv: list[float] | None, nt: list[str], cv: list[float] | None, cs: list[str]) -> None:
    assert 0.0 <= match_score(nv, nt, cv, cs) <= 1.0


def test_vectors_of_different_lengths_are_a_callers_error() -> None:
    with pytest.raises(ValueError, match="dimensions"):
        match_score([1.0, 0.0], (), [1.0, 0.0, 0.0], ())
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0


def test_skill_overlap_deduplicates_the_need() -> None:
    assert skill_overlap(["a", "a", "b"], ["a"]) == 0.5
    assert skill_overlap([], ["a"]) == 0.0


def test_screening_weights_and_top_l() -> None:
    assert screening_score(1.0, 1.0, 1.0) == pytest.approx(1.0)
    assert screening_score(1.0, 0.0, 0.0) == pytest.approx(0.5)
    assert screening_score(0.0, 1.0, 0.0) == pytest.approx(0.35)
    assert screening_score(0.0, 0.0, 1.0) == pytest.approx(0.15)
    assert screening_score(2.0, -1.0, math.nan) == pytest.approx(0.5), "inputs are clamped"
    items = [Screened(key=f"k{i:02d}", similarity=i / 20, prior=0.5, stability=1.0)
             for i in range(20)]
    random.Random(7).shuffle(items)
    kept = screen(items)
    assert [c.key for c in kept] == [f"k{i:02d}" for i in range(19, 19 - SCREEN_TOP_L, -1)]
    assert [c.key for c in screen(items, 3)] == ["k19", "k18", "k17"]
    # a strong prior outweighs a small similarity lead
    trusted = Screened(key="b", similarity=0.6, prior=1.0, stability=1.0)
    unknown = Screened(key="a", similarity=0.8, prior=0.0, stability=1.0)
    assert screen([unknown, trusted], 1) == [trusted]
    # ties go by key; a key counts once
    same = [Screened(key=k, similarity=0.5, prior=0.5, stability=0.5) for k in "cabb"]
    assert [c.key for c in screen(same, 10)] == ["a", "b", "c"]
    with pytest.raises(ValueError):
        screen(items, -1)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=64))
def test_quantization_round_trips_within_one_step(vector: list[float]) -> None:
    data, scale = quantize(vector)
    assert len(data) == len(vector)
    back = dequantize(data, scale)
    assert all(abs(a - b) <= scale / 2 + 1e-12 for a, b in zip(vector, back, strict=True))


def test_quantization_of_special_vectors() -> None:
    assert quantize([0.0, 0.0]) == (b"\x00\x00", 0.0)
    assert quantize([5e-324, -5e-324]) == (b"\x00\x00", 0.0), "a scale that underflows"
    assert dequantize(b"\x00\x00", 0.0) == [0.0, 0.0]
    data, scale = quantize([1.0, -1.0, 0.5])
    assert data == b"\x7f\x81\x40" and scale == pytest.approx(1 / 127)
    assert dequantize(b"\x80", 1.0) == [-128.0], "a peer's -128 decodes as itself"
    with pytest.raises(ValueError):
        quantize([math.inf])


def test_a_quantized_unit_vector_agrees_with_itself_and_not_with_another() -> None:
    rng = random.Random(3)
    for _ in range(20):
        v = [rng.gauss(0.0, 1.0) for _ in range(384)]
        norm = math.sqrt(sum(x * x for x in v))
        v = [x / norm for x in v]
        w = [rng.gauss(0.0, 1.0) for _ in range(384)]
        back = dequantize(*quantize(v))
        assert cosine(back, v) >= 0.999 > MIN_SELF_COSINE
        assert vector_agrees(back, v)
        assert not vector_agrees(back, w)
        assert not vector_agrees(back, v[:-1])
