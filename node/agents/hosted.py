"""The agents this node hosts, as the task market's executor runs them.

* Which agents and which cards: the ledger service's ``AgentCardsHost`` (node/agents/cards.py)
  resolves node.toml's ``[[agents]]`` (node/agents/config.py; the default generalist when
  there are none) and publishes their cards. The executor bids from exactly those cards, by
  the requester's own match rule (protocol/market/offers.py), so it bids with the agent the
  requester will rank best; :meth:`AgentRunner.use` takes them once published.
* :func:`tool_calls_for` runs an agent's tools for one task: the node's tools as they are
  now, with the operator's ``ToolPolicy`` and ``ToolLimits`` (``NodeTools.kit``,
  node/agents/toolbox.py, run by the ledger service), a :class:`ToolSession` naming the
  task's requester (a side-effecting tool runs only for requesters the operator allows), the
  bounded loop ``answer_with_tools`` on the solver's llama.cpp model under the JSON-schema
  grammar. An agent whose tools this requester may not run makes no call, except that a
  tool the loop must call first (an agent's only tool) is refused on the record (the result
  shows why). A tool the agent declares that is missing now (its MCP server failed) is left out
  of this task's session. Its calls become the result's
  ``ToolCallRecord`` s (bounded to the wire's limits), which the final, verifiable answer
  reads (models/cot.py).
* An agent with no tools and no system prompt (the default generalist) answers exactly as a
  node before agents did: :meth:`AgentRunner.context` is None for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from node.agents.config import AgentSpec
from node.agents.generation import llama_generate
from node.agents.loop import STEP_MAX_TOKENS, GenerateFn, answer_with_tools, forced_first_tool
from node.agents.settings import ToolSettings, builtin_tools
from node.agents.tools import (
    Tool,
    ToolLimits,
    ToolPolicy,
    ToolRegistry,
    ToolSession,
    build_registry,
)
from protocol.agents.cards import AgentCard
from protocol.agents.wire import (
    MAX_TOOL_ARGUMENTS_CHARS,
    MAX_TOOL_CALLS,
    MAX_TOOL_OUTPUT_CHARS,
    ToolCallRecord,
    canonical_arguments,
)
from protocol.market.messages import TaskSpec
from protocol.market.offers import ServedModel


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


#: () -> (the tools the node has now, the operator's policy, the bounds on every call)
ToolKit = Callable[[], tuple[Mapping[str, Tool], ToolPolicy, ToolLimits]]


def builtin_kit() -> tuple[Mapping[str, Tool], ToolPolicy, ToolLimits]:
    """The kit of a node without a ledger service: the built-in tools, default-deny, the
    default bounds."""
    settings = ToolSettings()
    return builtin_tools(settings), settings.policy, settings.limits


def _registry(declared: Sequence[str], tools: Mapping[str, Tool]) -> ToolRegistry:
    present = [name for name in declared
               if name in tools or any(k.startswith(name + ".") for k in tools)]
    return build_registry(present, tools)


async def tool_calls_for(agent: AgentSpec, task: TaskSpec, generate: GenerateFn,
                         kit: ToolKit) -> tuple[ToolCallRecord, ...]:
    """The tool calls ``agent`` makes for ``task`` (none when it has no usable tool)."""
    tools, policy, limits = kit()
    session = ToolSession(_registry(agent.tools, tools), policy, limits, task.requester)
    if not session.usable_specs() and \
            forced_first_tool(task.question, session.registry.specs) is None:
        return ()
    _, calls = await answer_with_tools(generate, system_prompt=agent.system_prompt,
                                       question=task.question, session=session)
    return tool_records(calls)


def tool_allowance_ms(limits: ToolLimits, tokens_per_s: float) -> int:
    """Milliseconds an agent's tools may add to a task within the operator's bounds: every
    call at its time limit, and every step of the loop (``max_calls`` calls, an unreadable
    reply, the answer-only step) at ``STEP_MAX_TOKENS`` on a model of ``tokens_per_s``."""
    steps_s = (limits.max_calls + 2) * STEP_MAX_TOKENS / max(tokens_per_s, 1e-3)
    return int(1000 * (limits.max_calls * limits.call_timeout_s + steps_s))


def tool_generator(solver: Any) -> GenerateFn | None:
    """Tool steps on the solver's own llama.cpp model, serialized with its generations by its
    lock (None when the solver has no llama.cpp model: its agents cannot call tools)."""
    llm = getattr(getattr(solver, "backend", None), "llm", None)
    lock = getattr(solver, "lock", None)
    if llm is None or lock is None:
        return None
    return llama_generate(llm, lock=lock)


def plain(agent: AgentSpec) -> bool:
    """Whether ``agent`` answers as a node before agents did (no tools, the default prompt)."""
    return not agent.tools and not agent.system_prompt


class AgentRunner:
    """The executor service's agents: the cards it bids with, and each job's agent context
    (the system prompt and tool calls the final answer reads; None: answer as today)."""

    def __init__(self) -> None:
        self.agents: tuple[AgentSpec, ...] = ()
        #: the cards it may bid with (``use``) and those it bids with now (``bid_cards``)
        self.usable: tuple[AgentCard, ...] = ()
        self.cards: tuple[AgentCard, ...] = ()
        #: agent -> the key of its loaded LoRA adapter (node/agents/adapters.py fills it)
        self.adapters: Mapping[str, str] = {}
        self.kit: ToolKit = builtin_kit
        self.generate: GenerateFn | None = None
        self.problem = ""

    def start(self, solver: Any) -> None:
        """Tool steps run on ``solver``'s model (None: its agents with tools cannot run)."""
        self.generate = tool_generator(solver)

    def use(self, agents: Sequence[AgentSpec], cards: Sequence[AgentCard],
            kit: ToolKit) -> tuple[AgentCard, ...]:
        """Host ``agents`` with their published ``cards``, running their tools from ``kit``;
        the cards to bid with. An agent with tools needs the llama.cpp solver: without one it
        does not bid (``problem``)."""
        self.kit = kit
        unable = {a.name for a in agents if a.tools and self.generate is None}
        self.problem = (f"agents {sorted(unable)} have tools, which need the llama.cpp solver: "
                        "they do not bid") if unable else ""
        self.agents = tuple(agents)
        self.usable = tuple(c for c in cards if c.name not in unable)
        return self.bid_cards()

    def bid_cards(self) -> tuple[AgentCard, ...]:
        """The cards to bid with now: an agent on an adapter bids once its adapter is loaded
        (``adapters``)."""
        waiting = {a.name for a in self.agents if a.adapter is not None} - set(self.adapters)
        self.cards = tuple(c for c in self.usable if c.name not in waiting)
        return self.cards

    def adapter(self, name: str) -> str | None:
        """The key of agent ``name``'s loaded adapter (None: it runs on the bare model)."""
        return self.adapters.get(name)

    def tool_ms(self, models: Sequence[ServedModel]) -> tuple[tuple[str, int], ...]:
        """``(agent, ms)`` its tools may add to a task (``tool_allowance_ms``), for each agent
        with tools: the executor counts it in the agent's bids, so the requester's due time
        for the attempt leaves room for a tool that runs to its limit."""
        _, _, limits = self.kit()
        speed = {m.name: m.tokens_per_s for m in models}
        slowest = min(speed.values(), default=1.0)
        return tuple((a.name, tool_allowance_ms(limits, speed.get(a.model or "", slowest)))
                     for a in self.agents if a.tools)

    async def context(self, name: str, task: TaskSpec
                      ) -> tuple[str, tuple[ToolCallRecord, ...]] | None:
        """``(system prompt, tool calls)`` of agent ``name`` for ``task``; None when it answers
        as a node before agents (no such agent, a plain agent, or a raw ``plain`` task)."""
        agent = next((a for a in self.agents if a.name == name), None)
        if agent is None or plain(agent) or task.style == "plain":
            return None
        calls: tuple[ToolCallRecord, ...] = ()
        if agent.tools and self.generate is not None:
            calls = await tool_calls_for(agent, task, self.generate, self.kit)
        return agent.system_prompt, calls
