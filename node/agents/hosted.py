"""The agents this node hosts in the task market: their cards, and how one answers a task.

* A :class:`HostedAgent` is what the operator declares for one agent (name, description,
  skills, tools by name, system prompt, model). A node that declares none hosts
  :data:`GENERALIST`: the node's model, today's prompt, no tools, so its answers are exactly
  those of a node before agents.
* :func:`hosted_cards` makes their ``protocol.agents.cards.AgentCard`` s: each description
  embedded (models/embedder.py, in the caller's worker thread) and quantized, with the
  embedder's hash, and each tool declared read-only or side-effecting as the tool itself says.
  The executor bids from these cards by the requester's own match rule
  (protocol/market/offers.py), so it bids with the agent the requester will rank best.
* :func:`tool_calls_for` runs an agent's tools for one task: a :class:`ToolSession` with the
  operator's ``ToolPolicy`` and the task's requester (a side-effecting tool runs only for
  requesters the operator allows), the bounded loop ``answer_with_tools`` on llama.cpp under
  the JSON-schema grammar. Its calls become the result's ``ToolCallRecord`` s (bounded to the
  wire's limits), which the final, verifiable answer reads (models/cot.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node.agents.generation import llama_generate
from node.agents.loop import GenerateFn, answer_with_tools
from node.agents.settings import ToolSettings, builtin_tools
from node.agents.tools import Tool, ToolSession, build_registry
from protocol.agents.cards import MAX_TOOL_DESCRIPTION_LEN, AgentCard, AgentTool
from protocol.agents.matching import normalize_tag, quantize
from protocol.agents.wire import (
    DEFAULT_AGENT,
    MAX_TOOL_ARGUMENTS_CHARS,
    MAX_TOOL_CALLS,
    MAX_TOOL_OUTPUT_CHARS,
    ToolCallRecord,
    canonical_arguments,
)
from protocol.market.messages import TaskSpec


@dataclass(frozen=True, slots=True)
class HostedAgent:
    name: str
    description: str
    skills: tuple[str, ...] = ()
    #: tool names: built-ins ("calculator", "docsearch") or an MCP server's "<server>.<tool>"
    tools: tuple[str, ...] = ()
    #: "" = the default prompt (models.cot.SYSTEM_PROMPT)
    system_prompt: str = ""
    #: a model the node serves; None = the node's model
    model: str | None = None
    price_per_1k: float = 0.0

    @property
    def plain(self) -> bool:
        """Whether it answers as a node before agents did (no tools, the default prompt)."""
        return not self.tools and not self.system_prompt


GENERALIST = HostedAgent(
    name=DEFAULT_AGENT,
    description="A general assistant: answers questions on any subject, reasoning step by step.")


def hosted_cards(agents: Sequence[HostedAgent], embed: Any, embedder_hash: bytes,
                 tools: Mapping[str, Tool]) -> tuple[AgentCard, ...]:
    """The cards of ``agents``; ``embed(texts) -> vectors`` (blocking: call in a thread)
    with ``embedder_hash``, or None (no embedder: cards without vectors, matched by skill
    tags only); ``tools`` the tools this node has, by name."""
    vectors = embed([a.description for a in agents]) if embed is not None else [()] * len(agents)
    cards = []
    for agent, vector in zip(agents, vectors, strict=True):
        data, scale = quantize(vector) if vector else (b"", 0.0)
        cards.append(AgentCard(
            name=agent.name, description=agent.description,
            skills=tuple(dict.fromkeys(normalize_tag(s) for s in agent.skills)),
            model=agent.model, adapter=None,
            tools=tuple(AgentTool(name=n, description=tools[n].spec.description[
                :MAX_TOOL_DESCRIPTION_LEN], side_effects=tools[n].spec.side_effects)
                for n in agent.tools if n in tools),
            price_per_1k_tokens=agent.price_per_1k, embedding=data, embedding_scale=scale,
            embedder_hash=embedder_hash if data else b""))
    return tuple(cards)


def tool_records(calls: Sequence[Mapping[str, Any]]) -> tuple[ToolCallRecord, ...]:
    """The loop's calls as the result carries them: at most ``MAX_TOOL_CALLS``, outputs cut
    to the wire's limit, arguments too long for it shown as ``{}`` (the final answer's prompt
    shows the records, so it shows exactly what the result says)."""
    records = []
    for call in calls[:MAX_TOOL_CALLS]:
        arguments = canonical_arguments(call.get("arguments", {}))
        if len(arguments) > MAX_TOOL_ARGUMENTS_CHARS:
            arguments = "{}"
        records.append(ToolCallRecord(name=str(call["name"]), arguments=arguments,
                                      output=str(call["output"])[:MAX_TOOL_OUTPUT_CHARS]))
    return tuple(records)


async def tool_calls_for(agent: HostedAgent, task: TaskSpec, generate: GenerateFn,
                         settings: ToolSettings, tools: Mapping[str, Tool]
                         ) -> tuple[ToolCallRecord, ...]:
    """The tool calls ``agent`` makes for ``task`` (none when it has no usable tool)."""
    session = ToolSession(build_registry(agent.tools, tools), settings.policy, settings.limits,
                          task.requester)
    if not session.usable_specs():
        return ()
    _, calls = await answer_with_tools(generate, system_prompt=agent.system_prompt,
                                       question=task.question, session=session)
    return tool_records(calls)


def tool_generator(solver: Any) -> GenerateFn | None:
    """Tool steps on the solver's own llama.cpp model, serialized with its generations by its
    lock (None when the solver has no llama.cpp model: its agents cannot call tools)."""
    llm = getattr(getattr(solver, "backend", None), "llm", None)
    lock = getattr(solver, "lock", None)
    if llm is None or lock is None:
        return None
    return llama_generate(llm, lock=lock)


class AgentRunner:
    """The executor service's agents: their cards once started, and each job's agent context
    (the system prompt and tool calls the final answer reads; None: answer as today)."""

    def __init__(self, agents: Sequence[HostedAgent], settings: ToolSettings) -> None:
        names = [a.name for a in agents]
        if not agents or len(set(names)) != len(names):
            raise ValueError(f"agents need distinct names, and at least one: {names}")
        self.agents = tuple(agents)
        self.settings = settings
        self.tools: dict[str, Tool] = {}
        self.generate: GenerateFn | None = None
        self.problem = ""

    def start(self, solver: Any) -> tuple[AgentCard, ...]:
        """The cards of the agents this solver can run (blocking: embeds; call in a thread).
        An agent with tools needs a llama.cpp solver: without one it is left out (``problem``
        says so)."""
        from models.embedder import EmbedderUnavailable, default_embedder

        self.tools = builtin_tools(self.settings)
        for agent in self.agents:
            build_registry(agent.tools, self.tools)  # raises ToolConfigError naming the tool
        self.generate = tool_generator(solver)
        if self.generate is None and any(a.tools for a in self.agents):
            self.problem = "agents with tools need the llama.cpp solver; they do not bid"
            self.agents = tuple(a for a in self.agents if not a.tools)
        embed, embedder_hash = None, b""
        if self.agents != (GENERALIST,):  # the lone default agent claims nothing in particular:
            try:  # its card carries no vector, and the node never loads the embedder
                embedder = default_embedder()
                embed, embedder_hash = embedder.embed, embedder.hash
            except EmbedderUnavailable as exc:
                self.problem = f"{self.problem}; no embedder ({exc})".lstrip("; ")
        return hosted_cards(self.agents, embed, embedder_hash, self.tools)

    async def context(self, name: str, task: TaskSpec
                      ) -> tuple[str, tuple[ToolCallRecord, ...]] | None:
        """``(system prompt, tool calls)`` of agent ``name`` for ``task``; None when it answers
        as a node before agents (no such agent, a plain agent, or a raw ``plain`` task)."""
        agent = next((a for a in self.agents if a.name == name), None)
        if agent is None or agent.plain or task.style == "plain":
            return None
        calls: tuple[ToolCallRecord, ...] = ()
        if agent.tools and self.generate is not None:
            calls = await tool_calls_for(agent, task, self.generate, self.settings, self.tools)
        return agent.system_prompt, calls
