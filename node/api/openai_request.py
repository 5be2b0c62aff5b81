"""OpenAI request bodies checked into ask requests (node/market/ask_request.py's fields).

:func:`chat_request` reads a ``POST /v1/chat/completions`` body, :func:`completion_request`
a ``POST /v1/completions`` body. Every parameter OpenAI defines is either honoured or refused
with :class:`OpenAIError` (400, ``param`` naming it); nothing is silently dropped except the
bookkeeping fields that change no output (``user``, ``metadata``, ``store``,
``service_tier``). Honoured: ``model`` (a name some peer serves per the ledger, whole or in
parts that cover all its blocks, else an agent's name on a live card in the ledger (the task
names that agent: ``ask["agent"]``; a served model of the same name wins), else 404
``model_not_found`` naming what is missing: protocol.inference.placement.place; "auto",
"symphony", "default" or "" mean any model),
``messages`` (system/developer, user and assistant turns, text content or text parts; the
last one must be the user's), ``prompt``, ``temperature``, ``top_p``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``n`` (1), ``stream`` and
``stream_options.include_usage``, and the neutral values of ``presence_penalty``,
``frequency_penalty``, ``logit_bias``, ``logprobs``, ``response_format`` and ``tools``.

The extension object ``symphony`` carries the network's own options: ``k`` (executors that
vote; a model served only in parts runs on one chain, so there k > 1 is a 400),
``answer_type``, ``choices``, ``deadline_ms``, ``family``, ``speculative`` (on a chain: at most that many
tokens drafted locally a step and verified by the chain in one pass; 0, the default, decodes
token by token; executors that hold the whole model ignore it), and what the task needs
(``needs``, ``skills``, ``agent``: node/market/ask_request.py), and ``mode``: "plan" (with
``planners``) answers by plan mode (node/market/plan_asks.py: planners split the question
into steps; the request is then one user message). With k = 1 and no answer
type a chat is sent to the model as it is (style "chat"); with a vote (k > 1) or an answer
type the executors reason step by step to a final answer that the vote compares (style
"cot").
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from protocol.inference.placement import Placement, Route

#: model names that mean "any model the network serves"
ANY_MODEL = ("", "auto", "symphony", "default")
#: OpenAI fields that change nothing in the output: accepted and ignored
BOOKKEEPING = ("user", "metadata", "store", "service_tier")
#: OpenAI fields accepted only at their neutral value (None always is)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},),
    "logprobs": (False,), "top_logprobs": (0,), "tools": ([],), "functions": ([],),
    "tool_choice": ("none",), "function_call": ("none",), "parallel_tool_calls": (True, False),
    "echo": (False,), "suffix": ("",), "best_of": (1,),
}
SAMPLING = ("temperature", "top_p", "stop", "seed")
EXTENSION_KEYS = ("k", "answer_type", "choices", "deadline_ms", "family", "speculative", "needs",
                  "skills", "agent", "mode", "planners")
#: OpenAI seeds are any int64; ours are 63-bit
SEED_MASK = (1 << 63) - 1
#: where a request for a model runs (protocol.inference.placement.place over the ledger)
Place = Callable[[str], Placement]


class OpenAIError(Exception):
    """An error answered with OpenAI's error object."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True, slots=True)
class Parsed:
    """What the routes need: the ask request, and how to answer."""

    ask: dict[str, Any]
    model: str  # as requested ("" = any; an agent's name when it names one)
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]


def _refuse_unknown(body: dict[str, Any], known: tuple[str, ...]) -> None:
    for key, value in body.items():
        if key in known or key in BOOKKEEPING:
            continue
        if key in NEUTRAL:
            if value is None or value in NEUTRAL[key]:
                continue
            raise OpenAIError(f"{key} is not supported by this network (only its neutral "
                              f"value {NEUTRAL[key][0]!r})", param=key,
                              code="unsupported_parameter")
        raise OpenAIError(f"Unrecognized request argument supplied: {key}", param=key,
                          code="unknown_parameter")


def _model(body: dict[str, Any], place: Place, agents: AbstractSet[str]) -> tuple[str, str]:
    """(model, agent) the request's ``model`` names: a served model wins over an agent."""
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError("model must be a string (a served model's name, an agent's name, "
                          "or \"auto\")", param="model")
    if model.lower() in ANY_MODEL:
        return "", ""
    placement = place(model)
    if placement.route is Route.NOT_FOUND:
        if model in agents:
            return "", model
        raise OpenAIError(placement.reason, status=404, param="model", code="model_not_found")
    return model, ""


def _max_tokens(body: dict[str, Any]) -> int | None:
    given = {k: body[k] for k in ("max_tokens", "max_completion_tokens")
             if body.get(k) is not None}
    for key, value in given.items():
        if type(value) is not int or value < 1:
            raise OpenAIError(f"{key} must be a positive integer", param=key)
    if len(set(given.values())) > 1:
        raise OpenAIError("max_tokens and max_completion_tokens differ: give one",
                          param="max_completion_tokens")
    return next(iter(given.values()), None)


def _sampling(body: dict[str, Any], ask: dict[str, Any]) -> tuple[str, ...]:
    """Copy temperature, top_p, stop and seed into ``ask``; the stop strings."""
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and type(value) not in (int, float):
            raise OpenAIError(f"{key} must be a number", param=key)
        if value is not None:
            ask[key] = value
    seed = body.get("seed")
    if seed is not None:
        if type(seed) is not int:
            raise OpenAIError("seed must be an integer", param="seed")
        ask["seed"] = seed & SEED_MASK
    stop = body.get("stop")
    stops: tuple[str, ...] = ()
    if stop is not None:
        ask["stop"] = stop
        stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop
                                                            if isinstance(s, str))
    n = body.get("n")
    if n is not None and n != 1:
        raise OpenAIError("n: only 1 choice per request is supported; for several "
                          "executors that vote, send symphony: {\"k\": 3}", param="n")
    return stops


def _extension(body: dict[str, Any], ask: dict[str, Any]) -> None:
    ext = body.get("symphony")
    if ext is None:
        return
    if not isinstance(ext, dict):
        raise OpenAIError("symphony must be an object", param="symphony")
    for key, value in ext.items():
        if key not in EXTENSION_KEYS:
            raise OpenAIError(f"symphony.{key} is unknown (known: {list(EXTENSION_KEYS)})",
                              param=f"symphony.{key}")
        ask[key] = value


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream") or False
    if type(stream) is not bool:
        raise OpenAIError("stream must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise OpenAIError("stream_options is only allowed with stream: true",
                          param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise OpenAIError("stream_options takes only include_usage", param="stream_options")
    return True, bool(options.get("include_usage"))


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise OpenAIError(f"{where}.content must be a string or a list of text parts (this "
                      "network serves text models)", param=where)


def _turns(messages: object) -> tuple[list[dict[str, str]], str]:
    """The earlier turns and the last user message."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages must be a non-empty list", param="messages")
    turns = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise OpenAIError(f"{where} must be an object", param=where)
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ("system", "user", "assistant"):
            raise OpenAIError(f"{where}.role {m.get('role')!r} is not supported (system, "
                              "developer, user, assistant)", param=where)
        turns.append({"role": str(role), "content": _text(m.get("content"), where)})
    if turns[-1]["role"] != "user":
        raise OpenAIError("the last message must be the user's", param="messages")
    return turns[:-1], turns[-1]["content"]


def _common(body: dict[str, Any], place: Place, known: tuple[str, ...],
            ask: dict[str, Any], agents: AbstractSet[str]) -> Parsed:
    _refuse_unknown(body, known)
    model, agent = _model(body, place, agents)
    stream, include_usage = _stream(body)
    ask["model"] = model
    if agent:
        ask["agent"] = agent
    max_tokens = _max_tokens(body)
    if max_tokens is not None:
        ask["max_tokens"] = max_tokens
    stops = _sampling(body, ask)
    _extension(body, ask)
    ask.setdefault("k", 1)  # one executor unless the request asks for a vote
    return Parsed(ask=ask, model=model or agent, stream=stream, include_usage=include_usage,
                  stop=stops)


CHAT_KEYS = ("model", "messages", "stream", "stream_options", "max_tokens",
             "max_completion_tokens", "n", "symphony", "response_format", *SAMPLING)
COMPLETION_KEYS = ("model", "prompt", "stream", "stream_options", "max_tokens", "n",
                   "symphony", *SAMPLING)


def chat_request(body: dict[str, Any], place: Place,
                 agents: AbstractSet[str] = frozenset()) -> Parsed:
    """A chat completion request as an ask (``agents``: the agent names a ``model`` may
    name); raises OpenAIError."""
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise OpenAIError("response_format: only {\"type\": \"text\"} is supported",
                          param="response_format")
    history, question = _turns(body.get("messages"))
    parsed = _common(body, place, CHAT_KEYS, {"question": question, "history": history},
                     agents)
    ask = parsed.ask
    ask["style"] = "chat" if ask["k"] == 1 and "answer_type" not in ask else "cot"
    return _plan_mode(parsed)


def _plan_mode(parsed: Parsed) -> Parsed:
    """A plan-mode request (``symphony.mode`` "plan") asks one question, reasoned step by
    step: earlier turns are refused, the style is "cot"."""
    ask = parsed.ask
    if ask.get("mode") != "plan":
        return parsed
    if ask.pop("history", None):
        raise OpenAIError("plan mode takes one user message (no earlier turns)",
                          param="messages")
    ask["style"] = "cot"
    return parsed


def completion_request(body: dict[str, Any], place: Place,
                       agents: AbstractSet[str] = frozenset()) -> Parsed:
    """A (legacy) completion request as an ask of the raw prompt; raises OpenAIError."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise OpenAIError("prompt must be a string (one prompt per request)", param="prompt")
    return _plan_mode(_common(body, place, COMPLETION_KEYS,
                              {"question": prompt, "style": "plain"}, agents))
