"""A population of agents with different skills and quality, and a stream of tasks for them.

Skills are topics: skill ``k`` has the unit vector ``e_k`` (coordinate ``k`` of ``dim``). A
description's vector is built with a chosen cosine to each topic it claims
(``sum_k claim_k * e_k`` plus a random residual in the coordinates no skill uses, so the
vector is a unit vector), then goes through the card's int8 quantization, as on the wire. A
task of skill ``s`` needs the text vector ``need_focus * e_s`` plus a random residual, and the
skill tag ``s``. So the cosine between a need and a description is the description's claim on
the need's skill (times ``need_focus``), up to the residuals' small dot product: vectors with
controlled similarity and no model.

The agents (quality = the probability that the agent answers a task of a skill right):

* specialists (``specialists_per_skill`` per skill): ``specialist_quality`` on their skill,
  ``off_skill_quality`` on any other; their card lists their skill's tag, and their
  description claims it with cosine ``specialist_claim`` (terse, undersold);
* generalists (``generalists``): ``generalist_quality`` on every skill; their card lists
  every skill's tag and their description claims each with cosine ``generalist_claim``
  (at most ``1 / sqrt(skills)``: a description that claims everything).

Every claim is jittered by a factor in ``[1 - claim_jitter, 1 + claim_jitter]``. With the
defaults the generalists' descriptions match a need better than the specialists' do, so text
matching alone routes to the generalists: what descriptions say is not what agents do, and
only outcomes can tell. With ``specialist_claim`` above ``generalist_claim`` it is the other
way round, and text matching alone routes right.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from protocol.agents.matching import dequantize, quantize

SKILL_NAMES = ("arithmetic", "translation", "search", "coding", "summarizing", "planning")


@dataclass(frozen=True, slots=True)
class AgentsConfig:
    seed: int = 0
    tasks: int = 800
    skills: int = 4
    specialists_per_skill: int = 2
    generalists: int = 4
    #: success probability of a specialist on its skill, and on any other skill
    specialist_quality: float = 0.9
    off_skill_quality: float = 0.2
    #: success probability of a generalist on every skill
    generalist_quality: float = 0.6
    #: cosine of a specialist's description with its skill's topic
    specialist_claim: float = 0.35
    #: cosine of a generalist's description with each skill's topic (<= 1 / sqrt(skills))
    generalist_claim: float = 0.5
    #: each claim is multiplied by a factor drawn in [1 - jitter, 1 + jitter]
    claim_jitter: float = 0.15
    #: cosine of a task's need vector with its skill's topic
    need_focus: float = 0.9
    #: dimension of the description and need vectors (skills use the first coordinates)
    dim: int = 32
    #: candidates that Symphony-Coord's screening keeps for the selector
    top_l: int = 6

    def check(self) -> None:
        if self.tasks < 4 or self.skills < 1 or self.dim <= self.skills:
            raise ValueError("need at least 4 tasks, 1 skill and dim > skills")
        if self.specialists_per_skill < 1 or self.generalists < 0 or self.top_l < 1:
            raise ValueError("need a specialist per skill and a positive top_l")
        if self.generalist_claim > 1 / math.sqrt(self.skills) + 1e-9:
            raise ValueError("generalist_claim over 1/sqrt(skills) is no unit vector")
        for name in ("specialist_claim", "need_focus", "claim_jitter"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class SimAgent:
    #: "agent-NN", numbered in a random order: selectors break ties by name, so a name must
    #: not tell a specialist from a generalist
    name: str
    #: "<skill> specialist" or "generalist", for reports
    kind: str
    #: the card's skill tags
    skills: tuple[str, ...]
    #: the card's description vector, as a requester dequantizes it from the card
    vector: tuple[float, ...]
    #: success probability per skill index
    quality: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SimTask:
    index: int
    skill: int
    tags: tuple[str, ...]
    need_vector: tuple[float, ...]
    #: the task's luck: an agent answers right iff ``luck < quality`` (the same draw for every
    #: selector, so they are compared on the same tasks with the same luck)
    luck: float


def skill_name(k: int) -> str:
    return SKILL_NAMES[k] if k < len(SKILL_NAMES) else f"skill-{k}"


def unit_vector(claims: dict[int, float], dim: int, first_free: int,
                rng: random.Random) -> list[float]:
    """``sum claims[k] * e_k`` completed to a unit vector by a random residual in coordinates
    ``first_free..dim-1`` (claims are scaled down first if their norm exceeds 1)."""
    norm = math.sqrt(sum(c * c for c in claims.values()))
    scale = 1.0 / norm if norm > 1.0 else 1.0
    v = [0.0] * dim
    for k, c in claims.items():
        v[k] = c * scale
    residual = [rng.gauss(0.0, 1.0) for _ in range(dim - first_free)]
    r_norm = math.sqrt(sum(x * x for x in residual)) or 1.0
    left = math.sqrt(max(0.0, 1.0 - sum(x * x for x in v)))
    for i, x in enumerate(residual):
        v[first_free + i] = left * x / r_norm
    return v


def _card_vector(claims: dict[int, float], cfg: AgentsConfig, rng: random.Random) -> tuple[
        float, ...]:
    jittered = {k: c * rng.uniform(1 - cfg.claim_jitter, 1 + cfg.claim_jitter)
                for k, c in claims.items()}
    data, scale = quantize(unit_vector(jittered, cfg.dim, cfg.skills, rng))
    return tuple(dequantize(data, scale))


def build_population(cfg: AgentsConfig, rng: random.Random) -> list[SimAgent]:
    """Specialists of each skill and generalists (see the module docstring), in a random
    order of names."""
    kinds: list[tuple[str, tuple[str, ...], dict[int, float], tuple[float, ...]]] = []
    every_skill = tuple(skill_name(k) for k in range(cfg.skills))
    for s in range(cfg.skills):
        quality = tuple(cfg.specialist_quality if k == s else cfg.off_skill_quality
                        for k in range(cfg.skills))
        for _ in range(cfg.specialists_per_skill):
            kinds.append((f"{skill_name(s)} specialist", (skill_name(s),),
                          {s: cfg.specialist_claim}, quality))
    for _ in range(cfg.generalists):
        kinds.append(("generalist", every_skill, dict.fromkeys(range(cfg.skills),
                                                               cfg.generalist_claim),
                      (cfg.generalist_quality,) * cfg.skills))
    numbers = list(range(len(kinds)))
    rng.shuffle(numbers)
    return [SimAgent(name=f"agent-{n:02d}", kind=kind, skills=skills,
                     vector=_card_vector(claims, cfg, rng), quality=quality)
            for n, (kind, skills, claims, quality) in zip(numbers, kinds, strict=True)]


def make_tasks(cfg: AgentsConfig, rng: random.Random) -> list[SimTask]:
    """``cfg.tasks`` tasks, each needing one skill drawn uniformly."""
    tasks = []
    for i in range(cfg.tasks):
        s = rng.randrange(cfg.skills)
        need = unit_vector({s: cfg.need_focus}, cfg.dim, cfg.skills, rng)
        tasks.append(SimTask(index=i, skill=s, tags=(skill_name(s),),
                             need_vector=tuple(need), luck=rng.random()))
    return tasks
