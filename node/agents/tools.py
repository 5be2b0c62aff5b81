"""The tools an agent may call, who may make it call them, and the bounds on every call.

Contract:
* A tool is anything with a :class:`ToolSpec` (name, description, the JSON schema of its
  arguments object, and whether it has side effects) and ``async run(arguments) -> str``.
* A task's requester is a remote peer, so every call is checked here before it runs, in this
  order: the per-task call budget (``max_calls``), the tool exists for this agent, the
  permission (:class:`ToolPolicy`: a tool with side effects runs only for the peer ids the
  operator listed for that tool; nobody by default), the arguments (a JSON object within
  ``MAX_ARGUMENTS_BYTES`` that fits the declared schema's simple types). Each refusal is a
  :class:`ToolRefused` (or :class:`ToolLimitReached`) whose message says why.
* A call that runs is bounded in time (``call_timeout_s``, a trio cancel scope: the tool is
  cancelled, and an MCP tool's server is stopped; starting the server, ``prepare``, has its
  own limit) and in output (``max_output_chars``;
  longer output is cut and ends with a marker saying how much was dropped).
* Every call, refused or not, is recorded in the session's ``calls`` (name, arguments,
  output or error text), which the task's result carries.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

#: most tool calls one task may make (refused calls count too: a model that keeps asking for
#: a tool it may not use must still come to an end)
MAX_CALLS_PER_TASK = 4
#: seconds one tool call may run before it is cancelled
CALL_TIMEOUT_S = 10.0
#: characters of one call's output passed on; the rest is dropped and marked
MAX_OUTPUT_CHARS = 4000
#: bytes of one call's arguments, JSON-encoded
MAX_ARGUMENTS_BYTES = 4096
#: upper bounds an operator's [tools] limits are checked against
LIMIT_BOUNDS = {"max_calls": (1, 32), "call_timeout_s": (0.01, 600.0),
                "max_output_chars": (16, 1_000_000)}
#: a tool name: built-ins are plain words, MCP tools are "<server>.<tool>"
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
TRUNCATION_MARKER = "\n[output truncated: {dropped} of {total} characters dropped]"

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,),
}


class ToolError(Exception):
    """A tool call that produced no output; the message is meant for the requester."""


class ToolRefused(ToolError):
    """The call was not run: unknown tool, not permitted for this requester, bad arguments."""


class ToolLimitReached(ToolRefused):
    """The task has made its ``max_calls`` tool calls."""


class ToolFailed(ToolError):
    """The call ran and failed: it timed out, its server crashed, or the tool reported an error."""


class ToolConfigError(ValueError):
    """An agent or operator setting names an unknown tool or breaks a bound."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    name: str
    description: str
    #: JSON schema of the arguments object
    parameters: Mapping[str, Any]
    #: True when a call can change anything outside this process (files, processes, network)
    side_effects: bool


class Tool(Protocol):
    @property
    def spec(self) -> ToolSpec: ...

    async def prepare(self) -> None:
        """Get ready for a call (an MCP server's process starts here), under the tool's own
        start limit rather than the call's timeout; a no-op for most tools."""
        ...

    async def run(self, arguments: dict[str, Any]) -> str: ...


@dataclass(frozen=True, slots=True)
class ToolLimits:
    max_calls: int = MAX_CALLS_PER_TASK
    call_timeout_s: float = CALL_TIMEOUT_S
    max_output_chars: int = MAX_OUTPUT_CHARS

    def __post_init__(self) -> None:
        for key, (lo, hi) in LIMIT_BOUNDS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not lo <= value <= hi or not math.isfinite(value):
                raise ToolConfigError(f"tools.{key} = {value!r} is outside [{lo}, {hi}]")


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """Which requesters may run which side-effecting tool: tool name -> allowed peer ids.

    Read-only tools run for anyone; a side-effecting tool runs only for the peer ids listed
    for it, so a tool nobody listed runs for nobody.
    """

    allow: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def permits(self, spec: ToolSpec, requester: str) -> bool:
        return not spec.side_effects or requester in self.allow.get(spec.name, frozenset())

    def check(self, spec: ToolSpec, requester: str) -> None:
        if not self.permits(spec, requester):
            raise ToolRefused(
                f"tool {spec.name!r} has side effects and the operator has not allowed "
                f"requester {requester!r} to run it")


class ToolRegistry:
    """The tools one agent may call, by name."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            name = tool.spec.name
            if not TOOL_NAME_RE.fullmatch(name):
                raise ToolConfigError(f"tool name {name!r} is not a valid tool name")
            if name in self._tools:
                raise ToolConfigError(f"two tools are named {name!r}")
            self._tools[name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self._tools.values()]

    def __len__(self) -> int:
        return len(self._tools)


def build_registry(declared: Sequence[str], available: Mapping[str, Tool]) -> ToolRegistry:
    """The registry of an agent whose card declares the tool names ``declared``.

    A name is a tool's full name (``calculator``, ``files.read_note``) or an MCP server's name,
    which brings every tool of that server (``files`` -> ``files.*``). An unknown name is a
    :class:`ToolConfigError` naming it.
    """
    chosen: dict[str, Tool] = {}
    for name in declared:
        if name in available:
            chosen[name] = available[name]
            continue
        group = {k: t for k, t in available.items() if k.startswith(name + ".")}
        if not group:
            raise ToolConfigError(f"the agent declares tool {name!r}, which this node does "
                                  f"not have (known: {', '.join(sorted(available)) or 'none'})")
        chosen.update(group)
    return ToolRegistry(chosen.values())


def check_arguments(spec: ToolSpec, arguments: object) -> dict[str, Any]:
    """``arguments`` if they are a JSON object within bounds that fits the schema's simple
    rules (required keys, no extra keys when ``additionalProperties`` is false, the JSON type
    and ``maxLength`` of each declared property); else :class:`ToolRefused`."""
    if not isinstance(arguments, dict):
        raise ToolRefused(f"tool {spec.name!r}: arguments must be a JSON object")
    try:
        size = len(json.dumps(arguments, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise ToolRefused(f"tool {spec.name!r}: arguments are not plain JSON ({exc})") from None
    if size > MAX_ARGUMENTS_BYTES:
        raise ToolRefused(f"tool {spec.name!r}: arguments take {size} bytes, more than "
                          f"{MAX_ARGUMENTS_BYTES}")
    properties = spec.parameters.get("properties", {})
    for key in spec.parameters.get("required", ()):
        if key not in arguments:
            raise ToolRefused(f"tool {spec.name!r}: missing argument {key!r}")
    for key, value in arguments.items():
        rule = properties.get(key)
        if rule is None:
            if spec.parameters.get("additionalProperties", True) is False:
                raise ToolRefused(f"tool {spec.name!r}: unknown argument {key!r}")
            continue
        _check_value(spec.name, key, rule, value)
    return arguments


def _check_value(tool: str, key: str, rule: Mapping[str, Any], value: object) -> None:
    kind = rule.get("type")
    accepted = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
    if accepted is not None:
        is_bool = isinstance(value, bool)
        if not isinstance(value, accepted) or (is_bool and kind != "boolean"):
            raise ToolRefused(f"tool {tool!r}: argument {key!r} must be a JSON {kind}")
    max_length = rule.get("maxLength")
    if isinstance(value, str) and isinstance(max_length, int) and len(value) > max_length:
        raise ToolRefused(f"tool {tool!r}: argument {key!r} is longer than {max_length} "
                          "characters")


def cap_output(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, plus a marker when anything was dropped."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + TRUNCATION_MARKER.format(dropped=len(text) - max_chars,
                                                       total=len(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One call a task made: what was asked, and the output (or the error) it got."""

    name: str
    arguments: Mapping[str, Any]
    output: str
    ok: bool

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments), "output": self.output}


class ToolSession:
    """One task's use of one agent's tools: the requester, the calls made, the budget left."""

    def __init__(self, registry: ToolRegistry, policy: ToolPolicy, limits: ToolLimits,
                 requester: str) -> None:
        self.registry = registry
        self.policy = policy
        self.limits = limits
        self.requester = requester
        self.calls: list[ToolCall] = []

    @property
    def remaining(self) -> int:
        return self.limits.max_calls - len(self.calls)

    def usable_specs(self) -> list[ToolSpec]:
        """The tools this requester may run (the ones worth offering to the model)."""
        return [s for s in self.registry.specs if self.policy.permits(s, self.requester)]

    async def call(self, name: str, arguments: object) -> str:
        """The tool's output, capped; raises :class:`ToolError` (and records the call)."""
        if self.remaining <= 0:
            raise ToolLimitReached(f"this task has made its {self.limits.max_calls} tool calls")
        shown = arguments if isinstance(arguments, dict) else {"_": repr(arguments)[:200]}
        try:
            output = await self._run(name, arguments)
        except ToolError as exc:
            self.calls.append(ToolCall(name=name, arguments=shown, output=f"error: {exc}",
                                       ok=False))
            raise
        self.calls.append(ToolCall(name=name, arguments=shown, output=output, ok=True))
        return output

    async def _run(self, name: str, arguments: object) -> str:
        tool = self.registry.get(name)
        if tool is None:
            raise ToolRefused(f"this agent has no tool named {name!r}")
        self.policy.check(tool.spec, self.requester)
        checked = check_arguments(tool.spec, arguments)
        await tool.prepare()
        timeout_s = self.limits.call_timeout_s
        with trio.move_on_after(timeout_s) as scope:
            output = await tool.run(checked)
        if scope.cancelled_caught:
            raise ToolFailed(f"tool {name!r} ran past its {timeout_s:g} s limit and was stopped")
        if not isinstance(output, str):
            raise ToolFailed(f"tool {name!r} returned no text")
        return cap_output(output, self.limits.max_output_chars)
