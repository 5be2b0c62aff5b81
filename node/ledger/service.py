"""The gossip ledger in the daemon: drives protocol/ledger/machine.py and keeps it in SQLite.

* Owns ``LedgerPush``, ``LedgerDigest`` and ``LedgerSyncRequest`` and the gossip topic
  ``ledger``. Anti-entropy, rate limits and rejections are the machine's; the driver performs
  its sends, publishes and penalties.
* ``start`` loads the stored envelopes and re-verifies them (``LedgerMachine.restore``);
  whatever no longer passes is deleted. ``Store*``/``Forget*`` effects are written at once,
  those of one event (a pulled batch) in one transaction (``performing``).
* This node's capability record: ``run`` polls (every ``capability_poll_ms``) what the node
  offers and submits ``SetCapability`` when it changed; the machine coalesces changes and
  re-signs periodically. Models, measured tokens/s, slots and load come from the executor
  service when one runs (``services["executor"]``, whose solver ran the models'
  self-benchmark at start); addresses from the transport; price, roles and tags from
  ``[ledger]``; hardware (models.device) is the host CPU until the executor's model is
  loaded, then the device that model runs on (its GPU's name and VRAM when it offloads
  there). Nothing here imports torch.
* Clock: the machine works in Unix epoch ms; ``clock_offset_ms`` (wall clock minus the
  driver's monotonic clock, fixed at start) converts, so every ``now`` handed to the machine
  or its view is ``ctx.clock()``.
* Query API for other services: ``reputation(peer)``, ``find_peers(model=, role=, ...)``,
  and ``machine.view`` (protocol/ledger/view.py) with ``ctx.clock()``; they attest by
  submitting protocol/ledger/events.py's ``Attest`` to this machine.
* Agent cards: node/agents/cards.py's ``AgentCardsHost`` (``self.agents``) resolves this
  node's ``[[agents]]`` against the models the executor serves (an unserved model fails the
  start), embeds and publishes their cards (``SetAgents``) once ``run`` starts, and checks each
  peer's new record (node/agents/checks.py); ``agent_embeddings = false`` in ``[ledger]``
  sends cards without vectors and verifies none (a light node). ``GET /agents`` lists the
  network's agents (node/agents/api.py). Stored in ``ledger_agents`` like records.
* Tools: node/agents/toolbox.py's ``NodeTools`` (``self.tools``: ``[tools]`` and
  ``[[mcp_servers]]``) runs in this service's nursery, so MCP servers start and stop with the
  daemon; cards are published once every server has listed its tools (or failed), and
  describe each tool as the toolbox does. The executor runs agents' tools with
  ``tools.kit()``.
* HTTP (mounted under ``/ledger``, read-only, open to local readers like ``/status``):
  ``GET /ledger/peers`` (``?model=&family=&role=&sort=``), ``GET /ledger/peers/{peer_id}``,
  ``GET /ledger/attestations`` (``?peer=&observer=&kind=&limit=``); and, with the API token,
  ``POST /ledger/capability`` (JSON ``tags``, ``price_per_1k_tokens``) to change what this
  node advertises without a restart (re-signed and published within ``min_republish_ms``).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import fields
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from models.device import describe_device
from node.agents.api import agents_routes
from node.agents.cards import AgentCardsHost
from node.agents.checks import CardEmbedder
from node.agents.settings import ToolSettings
from node.agents.toolbox import NodeTools
from node.ledger.api import ledger_routes
from node.ledger.store import SCHEMA, LedgerStore
from node.sections import fed_config, tuning
from node.service import NodeContext, Service
from protocol.ledger.cards import Held
from protocol.ledger.machine import (
    CapabilitySpec,
    ForgetAgentCards,
    ForgetAttestations,
    ForgetCapabilities,
    LedgerConfig,
    LedgerMachine,
    SetCapability,
    StoreAgentCards,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.messages import LEDGER_TOPIC, LedgerDigest, LedgerPush, LedgerSyncRequest
from protocol.ledger.records import (
    HASH_LEN,
    MAX_ADDRS,
    HardwareSummary,
    ModelOffer,
    Role,
)
from protocol.ledger.reputation import Reputation
from protocol.ledger.view import PeerMatch

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

#: roles that need a model to be worth advertising
_MODEL_ROLES = (Role.EXECUTOR, Role.VERIFIER)


@tuning(LedgerConfig, "record_ttl_ms", "refresh_ms", "min_republish_ms", "attestation_ttl_ms",
        "anti_entropy_ms", "sync_fanout", "sync_timeout_ms", "attestation_rate_per_minute")
class LedgerSection:
    """Tunables of the ledger (``[ledger]`` in node.toml); defaults from protocol/ledger/events.py."""

    #: roles this node offers (executor and verifier only when it serves a model)
    roles: tuple[str, ...] = ("executor", "verifier", "relay")
    tags: tuple[str, ...] = ()
    #: advertised price when no executor service sets one
    price_per_1k_tokens: float = 0.0
    #: how often the service checks whether what the node offers changed
    capability_poll_ms: int = 1_000
    #: embed agent cards' descriptions (models/embedder.py, the models extra): our cards carry
    #: vectors and peers' vectors are checked; false: neither (cards match by skill tags)
    agent_embeddings: bool = True

    def __post_init__(self) -> None:
        for role in self.roles:
            Role(role)  # ValueError names the bad role
        if self.price_per_1k_tokens < 0:
            raise ValueError("price_per_1k_tokens must not be negative")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"{f.name} must be positive, got {value!r}")
        if self.refresh_ms >= self.record_ttl_ms:
            raise ValueError("refresh_ms must be shorter than record_ttl_ms")

    def machine_config(self) -> LedgerConfig:
        return fed_config(self)


def detect_hardware(backend: object | None = None) -> HardwareSummary:
    """The device ``backend``'s model runs on (None: the host CPU), as the record carries it."""
    device = describe_device(backend)
    return HardwareSummary(device_kind=device.kind, device_name=device.name,
                           memory_bytes=device.memory_bytes, cpu_cores=device.cpu_cores)


class LedgerService(Service):
    name: ClassVar[str] = "ledger"
    message_types = (LedgerPush, LedgerDigest, LedgerSyncRequest)
    topics = (LEDGER_TOPIC,)
    schema = SCHEMA
    config_section = LedgerSection

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        try:
            self.section: LedgerSection = ctx.config.section(self.name)
        except (KeyError, AttributeError):
            self.section = LedgerSection()
        self.clock_offset_ms = int(time.time() * 1000) - ctx.clock()
        self._machine = LedgerMachine(
            ctx.identity,
            ctx.network_id,
            ctx.rng,
            self.section.machine_config(),
            clock_offset_ms=self.clock_offset_ms,
        )
        self.store = LedgerStore(ctx.db)
        self.hardware = detect_hardware()
        #: the model backend ``hardware`` describes (None: none loaded yet, the host CPU)
        self._hardware_of: object | None = None
        self._offered: CapabilitySpec | None = None
        #: operator changes at run time (``POST /ledger/capability``): tags, price
        self.overrides: dict[str, Any] = {}
        #: this node's tools: built-in and the MCP servers' (node/agents/toolbox.py)
        self.tools = NodeTools(getattr(ctx.config, "tools", ToolSettings()), ctx.log)
        #: this node's agents and the check of others' cards (node/agents/cards.py)
        self.agents = AgentCardsHost(self, getattr(ctx.config, "agents", ()),
                                     CardEmbedder(self.section.agent_embeddings),
                                     tool_info=self.tools.tool_info)

    @property
    def machine(self) -> LedgerMachine:
        return self._machine

    async def start(self) -> None:
        records, atts = self.store.load()
        report = self._machine.restore(records, atts, self.ctx.clock(),
                                       agents=self.store.load_agents())
        self.store.delete_stale(report)
        for held in self._machine.state.cards.held.values():  # checked again, as if new
            self.agents.stored(held)
        self.ctx.log.info(
            "ledger.restored",
            records=report.records,
            attestations=report.attestations,
            agents=report.agents,
            stale=len(report.stale_records) + len(report.stale_attestations)
            + len(report.stale_agents) + len(report.evicted),
        )

    async def perform(self, effect: object) -> None:
        if isinstance(effect, StoreCapability):
            self.store.save_capability(effect.envelope, effect.record)
        elif isinstance(effect, StoreAttestation):
            self.store.save_attestation(effect.envelope, effect.attestation, effect.hash)
        elif isinstance(effect, ForgetCapabilities):
            self.store.forget_capabilities(effect.peer_ids)
        elif isinstance(effect, ForgetAttestations):
            self.store.forget_attestations(effect.hashes)
        elif isinstance(effect, StoreAgentCards):
            self.store.save_agents(effect.envelope, effect.record)
            env = effect.envelope
            self.agents.stored(Held(env, effect.record, env.content_hash, self.now_ms()))
        elif isinstance(effect, ForgetAgentCards):
            self.store.forget_agents(effect.peer_ids)
            for peer in effect.peer_ids:
                self.agents.checker.forget(peer)
        else:
            await super().perform(effect)

    def performing(self) -> AbstractContextManager[object]:
        """One SQLite transaction for a pull's batch (hundreds of rows), not one per row."""
        return self.store.db.transaction()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.refresh_capability()
        assert self._offered is not None  # (refresh_capability set it)
        self.agents.resolve([m.name for m in self._offered.models])  # ConfigError: no start
        async with trio.open_nursery() as nursery:
            await nursery.start(self.tools.run)
            nursery.start_soon(self._agents, self._offered.price_per_1k_tokens)
            task_status.started()
            while True:
                await trio.sleep(self.section.capability_poll_ms / 1000)  # a periodic poll
                await self.refresh_capability()

    async def _agents(self, price: float) -> None:
        """Publish this node's cards (embedding takes a while) once the tools they describe
        are listed, then check peers' cards."""
        await self.tools.listed.wait()
        await self.agents.publish(price)
        await self.agents.checker.run()

    # ------------------------------------------------------------ our capability

    def offered(self) -> CapabilitySpec:
        """What this node offers right now (models and load from the executor service)."""
        models: list[ModelOffer] = []
        free_slots = max_slots = 0
        load = 0.0
        price = float(self.overrides.get("price_per_1k_tokens", self.section.price_per_1k_tokens))
        executor = self.ctx.services.get("executor")
        self._describe_model_device(executor)
        machine = getattr(executor, "machine", None)
        served = getattr(getattr(machine, "config", None), "models", ())
        for m in served:
            if len(m.model_hash) != HASH_LEN:
                continue
            models.append(
                ModelOffer(
                    name=m.name[:128],
                    family=m.family[:64],
                    quantization=getattr(m, "quantization", "")[:32],
                    context_length=m.context,
                    weights_hash=m.model_hash,
                    tokens_per_s=float(m.tokens_per_s),
                )
            )
            price = float(self.overrides.get("price_per_1k_tokens", m.price_per_1k))
        if models and machine is not None:
            max_slots = int(machine.config.slots)
            free_slots = int(machine.free_slots())
            load = (max_slots - free_slots) / max_slots if max_slots else 0.0
        roles = tuple(Role(r) for r in self.section.roles if models or Role(r) not in _MODEL_ROLES)
        from node.membership.service import agent_version

        return CapabilitySpec(
            listen_addrs=tuple(self.ctx.transport.listen_addrs())[:MAX_ADDRS],
            models=tuple(models),
            hardware=self.hardware,
            price_per_1k_tokens=price,
            free_slots=free_slots,
            max_slots=max_slots,
            load=min(1.0, max(0.0, load)),
            roles=roles,
            tags=tuple(self.overrides.get("tags", self.section.tags)),
            software_version=agent_version(),
            blocks=getattr(self.ctx.services.get("inference"), "block_offers", tuple)(),
            upload_bps=getattr(self.ctx.services.get("relay"), "advertised_upload_bps", int)(),
        )

    def _describe_model_device(self, executor: object) -> None:
        """Describe the device of the executor's model once its solver has loaded one."""
        backend = getattr(getattr(executor, "solver", None), "backend", None)
        if backend is not None and backend is not self._hardware_of:
            self._hardware_of = backend
            self.hardware = detect_hardware(backend)

    async def refresh_capability(self) -> None:
        spec = self.offered()
        if spec != self._offered:
            self._offered = spec
            await self.ctx.submit(self.name, SetCapability(spec))

    # ------------------------------------------------------------ query API

    def now_ms(self) -> int:
        """Unix epoch milliseconds on the ledger's clock (what records and JSON carry)."""
        return self.ctx.clock() + self.clock_offset_ms

    def reputation(self, peer: str) -> Reputation:
        return self._machine.view.reputation(peer, self.ctx.clock())

    def find_peers(self, **query: Any) -> list[PeerMatch]:
        """``LedgerView.find_peers`` at the current time (model=, family=, role=, ...)."""
        return self._machine.view.find_peers(self.ctx.clock(), **query)

    def status(self) -> dict[str, Any]:
        st = self._machine.status(self.ctx.clock())
        st["stored"] = self.store.counts()
        st["agents"] = {"hosted": [a.name for a in self.agents.hosted],
                        "checked": self.agents.checker.checked,
                        "refused": self.agents.checker.refused,
                        "pending": len(self.agents.checker.pending),
                        "embedder_problem": self.agents.embedder.problem}
        st["tools"] = self.tools.status()
        return st

    def routes(self) -> list[BaseRoute]:
        return ledger_routes(self)

    def root_routes(self) -> list[BaseRoute]:
        return agents_routes(self)
