"""An ask request (the JSON of ``POST /tasks/`` and of the OpenAI routes) checked into a
``SubmitTask``; every bad field raises :class:`AskError` naming it.

Fields: ``question`` (the last user turn, or the raw prompt with ``style`` "plain"),
``answer_type``, ``choices``, ``model``, ``family``, ``k``, ``deadline_ms``, ``max_tokens``
(defaults from ``[tasks]``), and the prompt and sampling the executors follow (TaskSpec):
``style`` ("cot" default, "chat", "plain"), ``history`` (earlier turns, ``[{"role",
"content"}]``), ``temperature`` (unset: protocol.market.sampling.default_temperature(k):
greedy for one executor, 0.5 for a vote), ``top_p``, ``seed`` (the seed base each
executor's seed derives from) and ``stop`` (a string or up to 4). What the task needs
(protocol/agents/wire.py): ``needs`` (text; the requester embeds it at submit), ``skills``
(tags: a list, or one comma-separated string) and ``agent`` (only that agent answers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import trio

from protocol.agents.cards import NAME_PATTERN, SKILL_PATTERN
from protocol.agents.matching import normalize_tag, quantize
from protocol.agents.wire import MAX_AGENT_NAME_LEN, MAX_NEED_SKILLS, MAX_NEEDS_CHARS
from protocol.answers import AnswerType
from protocol.market.events import SubmitTask
from protocol.market.messages import (
    MAX_K,
    MAX_QUESTION_CHARS,
    MAX_SEED,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_TASK_MS,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_TURNS,
    TASK_STYLES,
    TURN_ROLES,
    Turn,
)


class AskError(ValueError):
    """A request to ask is malformed (the routes answer 400 with this message)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        #: the request field at fault, when one is
        self.param = param


class AskDefaults(Protocol):
    default_k: int
    default_deadline_ms: int
    default_max_tokens: int
    default_max_price: float


def _integer(request: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = request.get(key)
    if value is None:
        return default
    if type(value) is not int or not lo <= value <= hi:
        raise AskError(f"{key} must be an integer in [{lo}, {hi}]", key)
    return value


def _number(request: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = request.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or not lo <= value <= hi:
        raise AskError(f"{key} must be a number in [{lo}, {hi}]", key)
    return float(value)


def _stop(value: object) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if value is None:
        return ()
    if (not isinstance(stops, list) or len(stops) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):
        raise AskError(f"stop must be a string or a list of at most {MAX_STOP} non-empty "
                       f"strings of at most {MAX_STOP_CHARS} characters", "stop")
    return tuple(stops)


def _history(value: object) -> tuple[Turn, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TURNS:
        raise AskError(f"history must be a list of at most {MAX_TURNS} turns", "history")
    turns = []
    for turn in value:
        if (not isinstance(turn, dict) or turn.get("role") not in TURN_ROLES
                or not isinstance(turn.get("content"), str)):
            raise AskError(f"each turn of history needs a role in {list(TURN_ROLES)} and a "
                           "string content", "history")
        turns.append(Turn(role=turn["role"], content=turn["content"]))
    return tuple(turns)


def _question(request: dict[str, Any], history: tuple[Turn, ...]) -> str:
    question = request.get("question")
    if not isinstance(question, str) or not question.strip():
        raise AskError("question must be a non-empty string", "question")
    total = len(question) + sum(len(t.content) for t in history)
    if total > MAX_QUESTION_CHARS:
        raise AskError(f"the question and its history are longer than {MAX_QUESTION_CHARS} "
                       "characters", "question")
    return question


def _need(request: dict[str, Any]) -> tuple[str, tuple[str, ...], str]:
    """``(needs, skills, agent)`` of a request (each may be absent)."""
    needs = request.get("needs") or ""
    if not isinstance(needs, str) or len(needs) > MAX_NEEDS_CHARS:
        raise AskError(f"needs must be a string of at most {MAX_NEEDS_CHARS} characters",
                       "needs")
    skills = request.get("skills") or []
    if isinstance(skills, str):
        skills = [s for s in skills.split(",") if s.strip()]
    if not isinstance(skills, list) or not all(isinstance(s, str) for s in skills):
        raise AskError("skills must be a list of tags or a comma-separated string", "skills")
    tags = tuple(dict.fromkeys(normalize_tag(s) for s in skills))
    if len(tags) > MAX_NEED_SKILLS or any(SKILL_PATTERN.fullmatch(t) is None or len(t) > 32
                                          for t in tags):
        raise AskError(f"skills: at most {MAX_NEED_SKILLS} tags of letters, digits and "
                       "+#._- (32 characters each)", "skills")
    agent = request.get("agent") or ""
    if not isinstance(agent, str) or len(agent) > MAX_AGENT_NAME_LEN or (
            agent and NAME_PATTERN.fullmatch(agent) is None):
        raise AskError("agent must be an agent's name ([A-Za-z0-9._-])", "agent")
    return needs.strip(), tags, agent


def parse_ask(request: dict[str, Any], defaults: AskDefaults, task_id: bytes) -> SubmitTask:
    """Validate an ask request into a ``SubmitTask`` for ``task_id``; raises AskError."""
    history = _history(request.get("history"))
    question = _question(request, history)
    answer_type = request.get("answer_type") or AnswerType.TEXT.value
    if answer_type not in {t.value for t in AnswerType}:
        raise AskError(f"answer_type must be one of {[t.value for t in AnswerType]}",
                       "answer_type")
    choices = request.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise AskError("choices must be a list of strings", "choices")
    style = request.get("style") or "cot"
    if style not in TASK_STYLES:
        raise AskError(f"style must be one of {list(TASK_STYLES)}", "style")
    model = request.get("model") or ""
    family = request.get("family") or ""
    if not isinstance(model, str) or not isinstance(family, str):
        raise AskError("model and family must be strings", "model")
    top_p = _number(request, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise AskError("top_p must be above 0", "top_p")
    needs, skills, agent = _need(request)
    return SubmitTask(
        needs=needs, skills=skills, agent=agent,
        question=question, answer_type=answer_type, choices=tuple(choices), model=model,
        family=family, k=_integer(request, "k", defaults.default_k, 1, MAX_K),
        deadline_ms=_integer(request, "deadline_ms", defaults.default_deadline_ms, 1_000,
                             MAX_TASK_MS),
        max_tokens=_integer(request, "max_tokens", defaults.default_max_tokens, 1, MAX_TOKENS),
        max_price=defaults.default_max_price, task_id=task_id, style=style, history=history,
        temperature=_number(request, "temperature", 0.0, MAX_TEMPERATURE),
        top_p=1.0 if top_p is None else top_p,
        seed=_integer(request, "seed", 0, 0, MAX_SEED), stop=_stop(request.get("stop")),
    )


class NeedEmbedder:
    """The requester's embedding of a task's ``needs`` (models/embedder.py, loaded at the
    first ask that names one; embedding runs in a worker thread, off the event loop)."""

    def __init__(self) -> None:
        self._embedder: Any = None

    def embedder(self) -> Any:
        """models/embedder.py's process-wide embedder (blocking the first time: it loads)."""
        if self._embedder is None:
            from models.embedder import default_embedder

            self._embedder = default_embedder()
        return self._embedder

    def embed(self, text: str) -> tuple[bytes, float, bytes]:
        """The text's vector, quantized, and the embedder's hash (blocking)."""
        embedder = self.embedder()
        data, scale = quantize(embedder.embed([text])[0])
        return data, scale, embedder.hash

    async def with_vector(self, event: SubmitTask) -> SubmitTask:
        """``event`` with its need's vector (unchanged when it names no need text)."""
        if not event.needs:
            return event
        try:
            # abandon_on_cancel: a daemon shutting down does not wait for the embedder to load
            data, scale, embedder_hash = await trio.to_thread.run_sync(
                self.embed, event.needs, abandon_on_cancel=True)
        except Exception as exc:  # e.g. models.embedder.EmbedderUnavailable
            raise AskError(f"needs: the text embedder is not available ({exc})",
                           "needs") from None
        return dataclasses.replace(event, need_embedding=data, need_scale=scale,
                                   embedder_hash=embedder_hash)
