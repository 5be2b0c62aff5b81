"""The ``[[agents]]`` tables of node.toml: the agents this node hosts.

Shape (``name``, ``description``, ``skills`` and ``tools`` are fixed: other tools write them)::

    [[agents]]
    name = "calc"                    # letters, digits, . _ -; unique on the node
    description = "Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly."
    skills = ["arithmetic", "math"]  # short tags (compared in lower case)
    tools = ["calculator"]           # tool names: built-in, or "<mcp server>.<tool>"
    model = "test-arith"             # optional: a model this node serves (default: its model)
    adapter = "calc-lora.gguf"       # optional: a LoRA adapter file, or its content hash
    system_prompt = "You compute."   # optional: stays on this node, never on the wire
    price = 0.5                      # optional: per 1k tokens (default: the node's price)

Every table is checked here against the limits peers apply to a card
(protocol/agents/cards.py), so a node never publishes a card its peers refuse; an unknown key
or a wrong type is an :class:`AgentConfigError` naming the agent and the key (node/config.py
turns it into its ``ConfigError``). An ``adapter`` that contains a ``/`` or ends in a weights
file suffix is a file path (it must exist; the card names it by its content hash), any other
value the content hash itself (what ``symphony rl publish`` prints): the executor fetches that
adapter through the relay (node/agents/adapters.py).

Which model an agent runs on needs the models the node serves, known once the executor has
loaded them: :func:`hosted_agents` resolves the default model and refuses a model the node
does not serve. A node with no ``[[agents]]`` hosts :data:`GENERALIST` on its model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from protocol.agents.cards import (
    MAX_ADAPTER_LEN,
    MAX_AGENT_NAME_LEN,
    MAX_AGENT_PRICE,
    MAX_AGENTS_PER_NODE,
    MAX_DESCRIPTION_LEN,
    MAX_MODEL_NAME_LEN,
    MAX_SKILL_LEN,
    MAX_SKILLS,
    MAX_TOOL_NAME_LEN,
    MAX_TOOLS,
    NAME_PATTERN,
    SKILL_PATTERN,
)
from protocol.agents.matching import normalize_tag

#: the node.toml key of the agents' array of tables
AGENTS_KEY = "agents"
AGENT_KEYS = ("name", "description", "skills", "model", "adapter", "system_prompt", "tools",
              "price")
_REQUIRED = ("name", "description")
#: characters of a system prompt (local only: it never travels)
MAX_SYSTEM_PROMPT_CHARS = 16_000
#: suffixes that make an ``adapter`` value a file path rather than a relay artifact name
ADAPTER_FILE_SUFFIXES = (".gguf", ".bin", ".safetensors")


class AgentConfigError(ValueError):
    """An ``[[agents]]`` table is wrong; the message names the agent and the key."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One agent this node hosts, as the operator declared it."""

    name: str
    description: str
    skills: tuple[str, ...] = ()
    #: a model the node serves; None: the node's model (``hosted_agents`` resolves it)
    model: str | None = None
    #: a LoRA adapter: a file path (``adapter_path``) or a relay artifact name; None: none
    adapter: str | None = None
    system_prompt: str = ""
    tools: tuple[str, ...] = ()
    #: per 1k tokens; None: the node's price
    price: float | None = None

    @property
    def adapter_path(self) -> Path | None:
        """The adapter's file, when ``adapter`` names a file (else None)."""
        if self.adapter is None or not _is_path(self.adapter):
            return None
        return Path(self.adapter).expanduser()


#: the agent of a node with no ``[[agents]]``: today's behaviour, on the node's model
GENERALIST = AgentSpec(
    name="generalist",
    description="General assistant: answers questions, reasons step by step, plans tasks.",
    skills=("general", "reasoning", "planning"),
)


def _is_path(adapter: str) -> bool:
    return "/" in adapter or adapter.lower().endswith(ADAPTER_FILE_SUFFIXES)


def _text(table: dict[str, Any], key: str, where: str, max_len: int) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise AgentConfigError(f"{where}: key {key!r} must be a non-empty string, got {value!r}")
    if len(value) > max_len:
        raise AgentConfigError(f"{where}: key {key!r} is longer than {max_len} characters")
    return value


def _names(table: dict[str, Any], key: str, where: str, max_items: int, max_len: int
           ) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AgentConfigError(f"{where}: key {key!r} must be a list of strings, got {value!r}")
    if len(value) > max_items:
        raise AgentConfigError(f"{where}: key {key!r} lists more than {max_items}")
    if len(set(value)) != len(value):
        raise AgentConfigError(f"{where}: key {key!r} repeats an entry: {value!r}")
    for v in value:
        if not v or len(v) > max_len:
            raise AgentConfigError(f"{where}: key {key!r}: {v!r} is empty or longer than "
                                   f"{max_len} characters")
    return tuple(value)


def _skills(table: dict[str, Any], where: str) -> tuple[str, ...]:
    skills = tuple(normalize_tag(s) for s in _names(table, "skills", where, MAX_SKILLS,
                                                    MAX_SKILL_LEN))
    for skill in skills:
        if SKILL_PATTERN.fullmatch(skill) is None:
            raise AgentConfigError(f"{where}: key 'skills': {skill!r} is not a tag "
                                   "(letters, digits and + # . _ -)")
    if len(set(skills)) != len(skills):
        raise AgentConfigError(f"{where}: key 'skills' repeats a tag: {skills!r}")
    return skills


def _optional(table: dict[str, Any], key: str, where: str, max_len: int) -> str | None:
    return _text(table, key, where, max_len) if key in table else None


def parse_agent(table: object, where: str) -> AgentSpec:
    """One ``[[agents]]`` table, checked (see the module docstring)."""
    if not isinstance(table, dict):
        raise AgentConfigError(f"{where} must be a table, got {table!r}")
    if isinstance(table.get("name"), str):
        where = f"{where} ({table['name']})"
    for key in table:
        if key not in AGENT_KEYS:
            raise AgentConfigError(f"{where}: unknown key {key!r} (known: "
                                   f"{', '.join(AGENT_KEYS)})")
    for key in _REQUIRED:
        if key not in table:
            raise AgentConfigError(f"{where}: key {key!r} is missing")
    name = _text(table, "name", where, MAX_AGENT_NAME_LEN)
    if NAME_PATTERN.fullmatch(name) is None:
        raise AgentConfigError(f"{where}: key 'name': {name!r} is not letters, digits, . _ -")
    tools = _names(table, "tools", where, MAX_TOOLS, MAX_TOOL_NAME_LEN)
    for tool in tools:
        if NAME_PATTERN.fullmatch(tool) is None:
            raise AgentConfigError(f"{where}: key 'tools': {tool!r} is not a tool name")
    price = table.get("price")
    if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)
                              or not math.isfinite(price) or not 0 <= price <= MAX_AGENT_PRICE):
        raise AgentConfigError(f"{where}: key 'price': {price!r} is not a number in "
                               f"0..{MAX_AGENT_PRICE:g}")
    adapter = _optional(table, "adapter", where, 4096)
    if adapter is not None and not _is_path(adapter) and len(adapter) > MAX_ADAPTER_LEN:
        raise AgentConfigError(f"{where}: key 'adapter': an artifact name is at most "
                               f"{MAX_ADAPTER_LEN} characters")
    spec = AgentSpec(
        name=name,
        description=_text(table, "description", where, MAX_DESCRIPTION_LEN),
        skills=_skills(table, where),
        model=_optional(table, "model", where, MAX_MODEL_NAME_LEN),
        adapter=adapter,
        system_prompt=(_text(table, "system_prompt", where, MAX_SYSTEM_PROMPT_CHARS)
                       if "system_prompt" in table else ""),
        tools=tools,
        price=None if price is None else float(price),
    )
    path = spec.adapter_path
    if path is not None and not path.is_file():
        raise AgentConfigError(f"{where}: key 'adapter': no adapter file at {path}")
    return spec


def parse_agents(value: object, source: str, error: type[ValueError] = AgentConfigError
                 ) -> tuple[AgentSpec, ...]:
    """The ``[[agents]]`` array of tables of node.toml (``source``: the file, for messages);
    a mistake raises ``error`` (node/config.py passes its ConfigError) naming it."""
    try:
        return _parse_agents(value, source)
    except AgentConfigError as exc:
        raise error(str(exc)) from None


def _parse_agents(value: object, source: str) -> tuple[AgentSpec, ...]:
    if not isinstance(value, list):
        raise AgentConfigError(f"{source}: {AGENTS_KEY!r} must be an array of tables "
                               f"[[{AGENTS_KEY}]], got {value!r}")
    if len(value) > MAX_AGENTS_PER_NODE:
        raise AgentConfigError(f"{source}: a node hosts at most {MAX_AGENTS_PER_NODE} agents, "
                               f"{len(value)} are declared")
    agents = tuple(parse_agent(t, f"{source}: [[agents]] #{i + 1}") for i, t in enumerate(value))
    names = [a.name for a in agents]
    for name in names:
        if names.count(name) > 1:
            raise AgentConfigError(f"{source}: agent name {name!r} is declared twice")
    return agents


def hosted_agents(declared: Sequence[AgentSpec], served_models: Sequence[str]
                  ) -> tuple[AgentSpec, ...]:
    """The agents this node hosts: ``declared`` (or :data:`GENERALIST` when none), each with
    its model resolved (None becomes the node's first served model); empty when the node
    serves no model; an agent naming a model not in ``served_models`` is an AgentConfigError
    that names it."""
    if not served_models:
        return ()
    agents = tuple(declared) or (GENERALIST,)
    resolved = []
    for agent in agents:
        if agent.model is not None and agent.model not in served_models:
            raise AgentConfigError(
                f"[[agents]] {agent.name}: key 'model': {agent.model!r} is not a model this "
                f"node serves (it serves: {', '.join(served_models)})")
        resolved.append(replace(agent, model=agent.model or served_models[0]))
    return tuple(resolved)
