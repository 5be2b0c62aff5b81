"""The tool interface's refusals and bounds (node/agents/tools.py), on in-process tools."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from node.agents.calculator import Calculator
from node.agents.tools import (
    MAX_ARGUMENTS_BYTES,
    ToolConfigError,
    ToolFailed,
    ToolLimitReached,
    ToolLimits,
    ToolPolicy,
    ToolRefused,
    ToolRegistry,
    ToolSession,
    ToolSpec,
    build_registry,
    cap_output,
)

ALICE = "12D3KooWAlice"
BOB = "12D3KooWBob"


class FileWriter:
    """A built-in-style tool with side effects: writes into a list the test can see."""

    spec = ToolSpec(name="notes.write", description="Write a note.",
                    parameters={"type": "object",
                                "properties": {"text": {"type": "string", "maxLength": 50}},
                                "required": ["text"], "additionalProperties": False},
                    side_effects=True)

    def __init__(self) -> None:
        self.written: list[str] = []

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        self.written.append(arguments["text"])
        return "written"


class Sleeper:
    spec = ToolSpec(name="sleeper", description="Never answers.", parameters={},
                    side_effects=False)

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        await trio.sleep_forever()
        return ""


class Flood:
    spec = ToolSpec(name="flood", description="Much output.", parameters={},
                    side_effects=False)

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        return "y" * 100_000


def _session(*tools: Any, allow: dict[str, frozenset[str]] | None = None,
             requester: str = ALICE, **limits: Any) -> ToolSession:
    return ToolSession(ToolRegistry(tools), ToolPolicy(allow or {}), ToolLimits(**limits),
                       requester)


def test_side_effecting_tool_refused_by_default_and_for_unlisted_peers() -> None:
    writer = FileWriter()
    for allow in ({}, {"notes.write": frozenset({BOB})}):
        session = _session(writer, allow=allow)
        with pytest.raises(ToolRefused, match="side effects.*not allowed requester"):
            trio.run(session.call, "notes.write", {"text": "hi"})
        assert session.calls[0].ok is False and "error:" in session.calls[0].output
        assert session.usable_specs() == []
    assert writer.written == []


def test_side_effecting_tool_runs_for_an_allowed_peer() -> None:
    writer = FileWriter()
    session = _session(writer, allow={"notes.write": frozenset({ALICE})})
    assert trio.run(session.call, "notes.write", {"text": "hi"}) == "written"
    assert writer.written == ["hi"]
    assert session.calls[0].as_json() == {"name": "notes.write", "arguments": {"text": "hi"},
                                          "output": "written"}


def test_read_only_tool_runs_for_anyone() -> None:
    session = _session(Calculator(), requester="12D3KooWStranger")
    assert trio.run(session.call, "calculator", {"expression": "2*3"}) == "6"


@pytest.mark.parametrize("name, arguments, match", [
    ("nope", {}, "no tool named"),
    ("calculator", ["2*3"], "must be a JSON object"),
    ("calculator", {}, "missing argument 'expression'"),
    ("calculator", {"expression": "1", "extra": 1}, "unknown argument 'extra'"),
    ("calculator", {"expression": 7}, "must be a JSON string"),
    ("calculator", {"expression": "1+" * 150}, "longer than 200"),
    ("calculator", {"expression": "1", "x": "a" * MAX_ARGUMENTS_BYTES}, "bytes, more than"),
    ("calculator", {"expression": float("nan")}, "not plain JSON"),
])
def test_bad_calls_are_refused(name: str, arguments: Any, match: str) -> None:
    session = _session(Calculator())
    with pytest.raises(ToolRefused, match=match):
        trio.run(session.call, name, arguments)


class Counter:
    spec = ToolSpec(name="counter", description="", side_effects=False,
                    parameters={"properties": {"n": {"type": "integer"}}})

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        return "ran"


def test_a_bool_is_not_an_integer() -> None:
    session = _session(Counter())
    with pytest.raises(ToolRefused, match="must be a JSON integer"):
        trio.run(session.call, "counter", {"n": True})
    assert trio.run(session.call, "counter", {"n": 3}) == "ran"


def test_a_hanging_tool_is_stopped_at_its_timeout() -> None:
    session = _session(Sleeper(), call_timeout_s=0.05)
    with pytest.raises(ToolFailed, match="ran past its 0.05 s limit"):
        trio.run(session.call, "sleeper", {})


def test_a_flooding_tool_is_capped_with_a_marker() -> None:
    session = _session(Flood(), max_output_chars=100)
    out = trio.run(session.call, "flood", {})
    assert out.startswith("y" * 100) and not out.startswith("y" * 101)
    assert out.endswith("[output truncated: 99900 of 100000 characters dropped]")
    assert cap_output("short", 100) == "short"


def test_max_calls_per_task() -> None:
    session = _session(Calculator(), max_calls=2)

    async def three() -> None:
        await session.call("calculator", {"expression": "1"})
        with pytest.raises(ToolRefused):
            await session.call("nope", {})  # a refused call counts too
        await session.call("calculator", {"expression": "2"})

    with pytest.raises(ToolLimitReached, match="made its 2 tool calls"):
        trio.run(three)
    assert len(session.calls) == 2 and session.remaining == 0


def test_limits_are_bounded() -> None:
    for bad in ({"max_calls": 0}, {"call_timeout_s": 0.0}, {"max_output_chars": 10**9},
                {"max_calls": True}, {"call_timeout_s": float("inf")}):
        with pytest.raises(ToolConfigError):
            ToolLimits(**bad)


def test_registry_from_declared_names() -> None:
    writer, calc = FileWriter(), Calculator()
    available = {"calculator": calc, "notes.write": writer}
    assert [s.name for s in build_registry(["calculator"], available).specs] == ["calculator"]
    assert [s.name for s in build_registry(["notes"], available).specs] == ["notes.write"]
    with pytest.raises(ToolConfigError, match="declares tool 'shell'"):
        build_registry(["shell"], available)
    with pytest.raises(ToolConfigError, match="two tools"):
        ToolRegistry([calc, calc])
