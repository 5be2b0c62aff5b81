"""Matching a task's need to an agent card, and Symphony-Coord's screening of candidates.

Contract
--------
* :func:`match_score` is the one match rule: the daemon's requester and the simulator both
  call it, with vectors and tags only (never a model: embedding the need's text is the
  caller's job, with the embedder whose hash the card names). It returns a score in [0, 1]::

      overlap    = |need_tags & card_skills| / |need_tags|        (need tags deduplicated)
      similarity = max(0, cos(need_vector, card_vector))          (0 if the card has none)

      need with tags and text:  W_SKILLS * overlap + (1 - W_SKILLS) * similarity
      need with tags only:      overlap
      need with text only:      similarity
      need with neither:        LEGACY_MATCH (0.5: a task that names no need, as every ask
                                did before agents, treats every agent alike)

  A negative cosine counts as no similarity, not as a penalty: an agent is not worse than
  unrelated for being unrelated in another direction.
* :func:`screen` is Symphony-Coord's screening: each candidate's
  ``W_SIMILARITY * similarity + W_PRIOR * prior + W_STABILITY * stability`` (inputs clamped
  to [0, 1]), the ``top_l`` best kept, ties by key so the choice is deterministic.
* :func:`quantize` / :func:`dequantize` turn a vector into the card's int8 bytes and scale and
  back; :func:`vector_agrees` says whether a card's vector is its own description's
  (the requester re-embeds the description and refuses a card that fails this).

Pure functions over sequences of floats; the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: weight of skill-tag overlap when a need has both tags and text (the rest is similarity)
W_SKILLS = 0.5
#: the score of every agent for a task that names no need (today's asks)
LEGACY_MATCH = 0.5
#: Symphony-Coord's screening weights (sum to 1)
W_SIMILARITY = 0.5
W_PRIOR = 0.35
W_STABILITY = 0.15
#: candidates kept by screening when the caller names no other number
SCREEN_TOP_L = 8
#: the int8 range a quantized component takes (symmetric: -127..127)
INT8_MAX = 127
#: least cosine between a card's (dequantized) vector and the requester's own embedding of the
#: card's description for the card to count as honest; int8 quantization alone keeps a unit
#: vector's cosine with itself far above this, a different description falls far below it
MIN_SELF_COSINE = 0.98


def normalize_tag(tag: str) -> str:
    """The canonical form of a skill tag: stripped, lower case (cards carry only this form)."""
    return tag.strip().lower()


def cosine(u: Sequence[float], v: Sequence[float]) -> float:
    """Cosine of the angle between ``u`` and ``v`` (0 when either is all zeros).

    Raises ValueError when the lengths differ (vectors of different embedders are never
    compared: the caller checks the embedder hash first)."""
    if len(u) != len(v):
        raise ValueError(f"vectors of {len(u)} and {len(v)} dimensions")
    dot = math.fsum(a * b for a, b in zip(u, v, strict=True))
    norm = math.sqrt(math.fsum(a * a for a in u)) * math.sqrt(math.fsum(b * b for b in v))
    if norm == 0.0 or not math.isfinite(norm) or not math.isfinite(dot):
        return 0.0
    return max(-1.0, min(1.0, dot / norm))


def similarity(u: Sequence[float], v: Sequence[float]) -> float:
    """``max(0, cos(u, v))``: the similarity term of the match, in [0, 1]."""
    return max(0.0, cosine(u, v))


def skill_overlap(need_tags: Iterable[str], card_skills: Iterable[str]) -> float:
    """The share of the need's (distinct, normalized) tags the card lists, in [0, 1]."""
    need = {normalize_tag(t) for t in need_tags}
    if not need:
        return 0.0
    have = {normalize_tag(s) for s in card_skills}
    return len(need & have) / len(need)


def match_score(
    need_vector: Sequence[float] | None,
    need_tags: Sequence[str],
    card_vector: Sequence[float] | None,
    card_skills: Sequence[str],
) -> float:
    """How well a card fits a need, in [0, 1] (the formula is in the module docstring).

    ``need_vector`` is None when the need has no text; ``card_vector`` is None when the card
    carries no vector or one from another embedder than the need's."""
    has_tags = any(normalize_tag(t) for t in need_tags)
    has_text = need_vector is not None
    if not has_tags and not has_text:
        return LEGACY_MATCH
    sim = 0.0
    if need_vector is not None and card_vector is not None:
        sim = similarity(need_vector, card_vector)
    if not has_tags:
        return sim
    overlap = skill_overlap((t for t in need_tags if normalize_tag(t)), card_skills)
    if not has_text:
        return overlap
    return W_SKILLS * overlap + (1.0 - W_SKILLS) * sim


# ---------------------------------------------------------------- screening


@dataclass(frozen=True, slots=True)
class Screened:
    """One candidate as screening sees it; ``key`` names it (an agent, a peer)."""

    key: str
    similarity: float
    #: the requester's prior on the candidate (its reputation), in [0, 1]
    prior: float
    #: how steadily the candidate has been available and consistent, in [0, 1]
    stability: float


def _unit(x: float) -> float:
    return min(1.0, max(0.0, x)) if math.isfinite(x) else 0.0


def screening_score(similarity: float, prior: float, stability: float) -> float:
    """Symphony-Coord's screening score, in [0, 1] (inputs clamped to [0, 1])."""
    return (
        W_SIMILARITY * _unit(similarity) + W_PRIOR * _unit(prior) + W_STABILITY * _unit(stability)
    )


def screen(candidates: Sequence[Screened], top_l: int = SCREEN_TOP_L) -> list[Screened]:
    """The ``top_l`` candidates by screening score, best first; one per key (the first)."""
    if top_l < 0:
        raise ValueError(f"top_l must be >= 0, got {top_l}")
    seen: set[str] = set()
    distinct = []
    for c in candidates:
        if c.key not in seen:
            seen.add(c.key)
            distinct.append(c)
    ranked = sorted(
        distinct, key=lambda c: (-screening_score(c.similarity, c.prior, c.stability), c.key)
    )
    return ranked[:top_l]


# ---------------------------------------------------------------- vectors on the wire


def quantize(vector: Sequence[float]) -> tuple[bytes, float]:
    """``vector`` as int8 components (one signed byte each) and the scale that restores it:
    ``component ~= int8 * scale`` with ``scale = max|component| / 127`` (0.0 for a zero
    vector, and for one so small that its scale underflows to zero). Raises ValueError for a
    non-finite component."""
    if not all(math.isfinite(x) for x in vector):
        raise ValueError("a vector to quantize must be finite")
    scale = max((abs(x) for x in vector), default=0.0) / INT8_MAX
    if scale == 0.0:
        return bytes(len(vector)), 0.0
    q = (max(-INT8_MAX, min(INT8_MAX, round(x / scale))) for x in vector)
    return bytes(v & 0xFF for v in q), scale


def dequantize(data: bytes, scale: float) -> list[float]:
    """The vector that ``quantize`` encoded as ``data`` and ``scale``."""
    return [(b - 256 if b > INT8_MAX else b) * scale for b in data]


def vector_agrees(
    card_vector: Sequence[float], embedded: Sequence[float], min_cosine: float = MIN_SELF_COSINE
) -> bool:
    """Whether a card's vector is (up to quantization) ``embedded``, the requester's own
    embedding of the card's description. Vectors of different lengths never agree."""
    if len(card_vector) != len(embedded):
        return False
    return cosine(card_vector, embedded) >= min_cosine
