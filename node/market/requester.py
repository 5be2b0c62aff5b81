"""The requester side of the task market in the daemon: drives protocol/market/auction.py.

* Owns ``Bid``, ``Result`` and ``Reject``; publishes beacons (the executor service, in
  node/market/executor.py, owns the beacon topic and the executor side).
* Every ``TaskUpdated`` snapshot is written to the ``tasks`` table (JSON, one row per task),
  so ``symphony tasks list/show`` and ``GET /tasks/{id}`` read the database, and a requester
  restarted with open tasks resumes them (``RestoreTask``: kept results, a new beacon round)
  or fails them cleanly when their deadline has passed. Wall-clock deadlines are stored,
  because the daemon's millisecond clock restarts with the process.
* The LinUCB selector's state lives in ``task_bandit`` and is saved after every finished
  task, so learning survives restarts.
* Reputation comes from the ledger service (``services["ledger"].machine.view``) when one is
  running, else every peer is neutral (0.5). ``Attest`` effects become ledger attestations
  (``protocol.ledger.machine.Attest``) the same way, and are only logged without a ledger.
* Agents: a task that names a need (node/market/ask_request.py: ``needs``, ``skills``,
  ``agent``) has its ``needs`` embedded at submit (models/embedder.py, in a worker thread;
  the embedder loads at the first such ask), and each bid on it is matched by the auction
  from the bidder's agent card in our ledger (``cards_of``, protocol.agents.wire.agent_matcher).
* ``ask(...)`` submits a task and waits (bounded by its deadline) for its final snapshot; the
  HTTP routes in node/market/api.py call it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import trio

from node.agents.api import agent_created
from node.api.openai_routes import openai_routes
from node.market.api import task_routes
from node.market.ask_request import AskError, NeedEmbedder, parse_ask
from node.market.chain_asks import ChainAsks, interrupted
from node.market.live_plans import LivePlans
from node.market.live_text import LiveTexts
from node.market.plan_asks import PlanChildren, interrupted_plan, parse_plan_ask, plan_mode
from node.market.restore import restore_event
from node.sections import fed_config, feed, tuning
from node.service import NodeContext, Service
from protocol.agents.cards import AgentCards
from protocol.agents.pipeline import PipelineConfig, PlanPipeline
from protocol.agents.plan_runs import PlanUpdated, SubmitPlanTask
from protocol.agents.planning import PlanningRequester
from protocol.agents.wire import agent_matcher
from protocol.inference.placement import Placement, Route
from protocol.ledger.trust import TrustView
from protocol.market.attestations import ledger_attestation
from protocol.market.auction import (
    Attest,
    Auction,
    AuctionConfig,
    AuctionOptions,
    SubmitTask,
    TaskUpdated,
)
from protocol.market.bidders import possible_bidders
from protocol.market.linucb import DEFAULT_ALPHA, DEFAULT_LAMBDA, FEATURES, LinUCB, LinUCBSelector
from protocol.market.messages import (
    MAX_K,
    Bid,
    Reject,
    Result,
)
from protocol.market.progress import Progress, Streamed
from protocol.market.selection import ScoreSelector, Selector
from protocol.market.state import OpenTask
from protocol.verification.requester import VerifiedAuction

#: snapshots of finished tasks kept in memory for waiters (the database keeps them all)
MAX_CACHED_SNAPSHOTS = 256
#: an ask waits this much longer than its deadline for the final vote
ASK_GRACE_S = 5.0
OPEN_PHASES = ("bidding", "running")


@tuning(AuctionConfig, "bid_window_ms", "spare_bids", "max_rounds", "backoff_base_ms",
        "backoff_max_ms", "min_round_ms", "assign_base_ms", "assign_slack",
        # plan mode (protocol/agents/pipeline.py): planners asked, tries of a step before its
        # plan fails, fresh planners per plan, a planner's tokens
        also=feed(PipelineConfig, "planners", "plan_tokens", plan_step_tries="step_tries",
                  plan_replans="replans"))
class TasksSection:
    """Tunables of the requester side (``[tasks]`` in node.toml)."""

    #: "score" (weighted sum, protocol/market/selection.py) or "linucb" (protocol/market/linucb.py)
    selector: str = "score"
    linucb_alpha: float = DEFAULT_ALPHA
    linucb_lambda: float = DEFAULT_LAMBDA
    default_k: int = 3
    default_deadline_ms: int = 120_000
    default_max_tokens: int = 256
    #: price ceiling per executor when a request names none
    default_max_price: float = 1e6

    def __post_init__(self) -> None:
        if self.selector not in ("score", "linucb"):
            raise ValueError(f"selector must be 'score' or 'linucb', got {self.selector!r}")
        if not 1 <= self.default_k <= MAX_K:
            raise ValueError(f"default_k must be in [1, {MAX_K}]")
        for name in ("bid_window_ms", "max_rounds", "backoff_base_ms", "backoff_max_ms",
                     "assign_base_ms", "default_deadline_ms", "default_max_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        self.pipeline_config()  # PipelineConfig checks the plan-mode keys

    def pipeline_config(self) -> PipelineConfig:
        return fed_config(self, PipelineConfig)  # type: ignore[no-any-return]


class TasksService(Service):
    name: ClassVar[str] = "tasks"
    message_types = (Bid, Result, Reject, Progress)
    config_section = TasksSection
    schema = """
    CREATE TABLE IF NOT EXISTS tasks (
        task_id TEXT PRIMARY KEY,
        phase TEXT NOT NULL,
        created_at REAL NOT NULL,      -- wall clock, seconds
        deadline_at REAL NOT NULL,     -- wall clock, seconds
        snapshot TEXT NOT NULL         -- protocol.market.state.TaskSnapshot as JSON
    );
    CREATE INDEX IF NOT EXISTS tasks_by_phase ON tasks(phase);
    CREATE INDEX IF NOT EXISTS tasks_by_created ON tasks(created_at);
    CREATE TABLE IF NOT EXISTS task_bandit (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        state TEXT NOT NULL            -- protocol.market.linucb.LinUCB.to_dict() as JSON
    );
    """

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.section: TasksSection = ctx.config.section(self.name)
        s = self.section
        self._bandit: LinUCB | None = None
        self._linucb: LinUCBSelector | None = None
        self._trust_view: TrustView | None = None
        selector: Selector = ScoreSelector(group_of=self.group)
        if s.selector == "linucb":
            self._bandit = LinUCB(len(FEATURES), alpha=s.linucb_alpha, ridge=s.linucb_lambda)
            selector = self._linucb = LinUCBSelector(self._bandit)
        self.selector = selector
        from node.verification.service import requester_machine  # VerifiedAuction if [verify] on

        # the ledger's answers, as the simulator's (protocol/market/options.py)
        self._machine = requester_machine(ctx, selector, fed_config(s), AuctionOptions(
            reputation=self.reputation, possible_bidders=self.possible_bidders,
            agent_match=agent_matcher(self.cards_of)))
        self.needs = NeedEmbedder()
        # plan mode: the pipeline beside the auction, one machine (protocol/agents/planning.py)
        self._requester = PlanningRequester(self._machine, PlanPipeline(
            s.pipeline_config(), self.reputation, lambda: ctx.rng.randbytes(32)))
        self._plan_children = PlanChildren(
            self.needs, lambda event: ctx.submit(self.name, event), ctx.log)
        self._waiters: dict[str, trio.Event] = {}
        self._latest: dict[str, dict[str, Any]] = {}
        self._restored = 0
        self._started_at = time.time()
        # asks for a model served only in parts run on a chain of block servers
        self.chains = ChainAsks(ctx, self.record, int(self._started_at * 1000))
        # k=1 market tasks: the text their executor streams, as it grows
        self.live = LiveTexts(self._machine.progress.text, self._over)
        self.plans_live = LivePlans()  # plan tasks' snapshots as their steps complete

    @property
    def machine(self) -> PlanningRequester:
        return self._requester

    @property
    def auction(self) -> Auction | VerifiedAuction:
        return self._machine

    # ---------------------------------------------------------------- ledger adapters

    def _trust(self) -> TrustView | None:
        view = getattr(getattr(self.ctx.services.get("ledger"), "machine", None), "view", None)
        if view is None:
            return None
        if self._trust_view is None or self._trust_view.view is not view:
            self._trust_view = TrustView(view)
        return self._trust_view

    def reputation(self, peer: str) -> float:
        """The peer's earned reputation (protocol.ledger.trust), as the simulator's requester."""
        trust = self._trust()
        return 0.5 if trust is None else trust.record(peer, self.ctx.clock())

    def group(self, peer: str) -> str:
        """The peer's praise group, for choosing independent executors."""
        trust = self._trust()
        return peer if trust is None else trust.group(peer, self.ctx.clock())

    def possible_bidders(self, task: OpenTask) -> int | None:
        """Live executors in the ledger that could bid on ``task`` (None without a ledger)."""
        trust = self._trust()
        return None if trust is None else possible_bidders(trust.view, task, self.ctx.clock())

    def cards_of(self, peer: str) -> AgentCards | None:
        """``peer``'s agent cards as our ledger holds them, a vector we have not verified
        dropped (node/agents/cards.py ``matchable``); None: none held, or no ledger."""
        host = getattr(self.ctx.services.get("ledger"), "agents", None)
        return None if host is None else host.matchable(peer)

    async def _attest(self, effect: Attest) -> None:
        self.ctx.log.info("tasks.attest", subject=effect.subject, task_id=effect.task_id.hex(),
                          outcome=effect.outcome, detail=effect.detail)
        if "ledger" not in self.ctx.services:
            return
        await self.ctx.submit("ledger", ledger_attestation(effect))

    # ---------------------------------------------------------------- storage

    async def start(self) -> None:
        if self._linucb is not None:
            rows = self.ctx.db.query("SELECT state FROM task_bandit WHERE id = 1")
            if rows:
                try:
                    restored = LinUCB.from_dict(json.loads(rows[0]["state"]))
                    # the machine holds this selector: it chooses by the saved model from now
                    self._linucb.load(restored)
                    self._bandit = restored
                except ValueError as exc:
                    self.ctx.log.warning("tasks.bandit_state_unreadable", error=str(exc))

    def _wall(self, at_ms: int) -> float:
        return time.time() + (at_ms - self.ctx.clock()) / 1000.0

    def _store(self, snap: dict[str, Any]) -> None:
        task_id = str(snap["task_id"])
        created = self._wall(int(snap["created_at_ms"]))
        deadline = self._wall(int(snap["deadline_at_ms"]))
        with self.ctx.db.transaction() as conn:
            conn.execute(
                "INSERT INTO tasks(task_id, phase, created_at, deadline_at, snapshot) "
                "VALUES(?, ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
                "phase = excluded.phase, deadline_at = excluded.deadline_at, "
                "snapshot = excluded.snapshot",
                (task_id, snap["phase"], created, deadline, json.dumps(snap)))
            if self._bandit is not None and snap["phase"] not in OPEN_PHASES:
                conn.execute("INSERT INTO task_bandit(id, state) VALUES(1, ?) ON CONFLICT(id) "
                             "DO UPDATE SET state = excluded.state",
                             (json.dumps(self._bandit.to_dict()),))

    def load(self, task_id: str) -> dict[str, Any] | None:
        rows = self.ctx.db.query("SELECT snapshot FROM tasks WHERE task_id = ?", (task_id,))
        return json.loads(rows[0]["snapshot"]) if rows else None

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.ctx.db.query(
            "SELECT snapshot FROM tasks ORDER BY created_at DESC LIMIT ?", (limit,))
        return [json.loads(r["snapshot"]) for r in rows]

    def _over(self, task_id: bytes) -> bool:
        task = self._machine.tasks.get(task_id)
        return task is None or task.finished

    def record(self, snap: dict[str, Any]) -> None:
        """Store a task's snapshot; a finished one is kept for waiters and wakes them."""
        self._store(snap)
        self.plans_live.update(snap)
        task_id = str(snap["task_id"])
        if snap["phase"] not in OPEN_PHASES:
            self._latest[task_id] = snap
            while len(self._latest) > MAX_CACHED_SNAPSHOTS:
                del self._latest[next(iter(self._latest))]
            waiter = self._waiters.pop(task_id, None)
            if waiter is not None:
                waiter.set()
            self.live.poke(bytes.fromhex(task_id))

    async def perform(self, effect: object) -> None:
        if isinstance(effect, TaskUpdated):
            self.record(effect.snapshot.to_dict())
        elif isinstance(effect, Attest):
            await self._attest(effect)
        elif isinstance(effect, Streamed):
            self.live.poke(effect.task_id)
        elif isinstance(effect, PlanUpdated):
            self.record(effect.snapshot)
        elif isinstance(effect, SubmitTask):  # a plan's planner or step
            await self._plan_children(effect)
        else:
            from node.verification.service import (
                perform_verification_effect,  # verdict attestations
            )

            if not await perform_verification_effect(self.ctx, effect):
                await super().perform(effect)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume (or cleanly fail) the tasks left open by the previous process."""
        rows = self.ctx.db.query(
            "SELECT snapshot, deadline_at FROM tasks WHERE phase IN ('bidding', 'running')")
        for row in rows:
            snap = json.loads(row["snapshot"])
            # a chain's sessions are gone; a plan's pipeline state too
            failed = interrupted(snap, self.ctx.clock()) or interrupted_plan(snap,
                                                                             self.ctx.clock())
            if failed is not None:
                self.record(failed)
                continue
            remaining_ms = int((float(row["deadline_at"]) - time.time()) * 1000)
            await self.ctx.submit(self.name, restore_event(snap, self.ctx.identity.peer_id,
                                                           remaining_ms))
            self._restored += 1
        if rows:
            self.ctx.log.info("tasks.restored", count=len(rows))
        task_status.started()

    # ---------------------------------------------------------------- asking

    def submit_event(self, request: dict[str, Any]) -> SubmitTask:
        """Validate an ask request (JSON-like, node/market/ask_request.py) into a
        ``SubmitTask``; raises AskError."""
        return parse_ask(request, self.section, self.ctx.rng.randbytes(32))

    async def ask(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]:
        event: SubmitTask | SubmitPlanTask
        if plan_mode(request):
            event = parse_plan_ask(request, self.section, self.section.planners,
                                   self.ctx.rng.randbytes(32))
        else:
            # nobody follows the text of an ask that waits for its whole answer: its
            # executor need not stream it (progress frames cost its cores)
            event = dataclasses.replace(
                await self.needs.with_vector(self.submit_event(request)), stream=not wait)
            placement = self.chains.place(event.model, event.family)
            if placement.route is Route.CHAIN:
                return await self.chains.ask(event, request, placement, wait=wait)
        assert event.task_id is not None  # submit_event always draws one
        task_id = event.task_id.hex()
        done = self._waiters[task_id] = trio.Event()
        await self.ctx.submit(self.name, event)
        if wait:
            with trio.move_on_after(event.deadline_ms / 1000.0 + ASK_GRACE_S):
                await done.wait()
        self._waiters.pop(task_id, None)
        snap = self._latest.get(task_id) or self.load(task_id)
        if snap is None:
            raise AskError("the task was refused by the auction (see the daemon log)")
        return snap

    async def wait_done(self, task_id: str) -> dict[str, Any]:
        """The snapshot of our task ``task_id`` once it is finished (or as it stands when its
        deadline and the grace after it have passed)."""
        snap = self._latest.get(task_id) or self.load(task_id)
        if snap is None:
            raise AskError(f"no task {task_id}")
        if snap["phase"] in OPEN_PHASES:
            done = self._waiters.setdefault(task_id, trio.Event())
            left_s = (int(snap["deadline_at_ms"]) - self.ctx.clock()) / 1000.0
            with trio.move_on_after(max(0.0, left_s) + ASK_GRACE_S):
                await done.wait()
            snap = self._latest.get(task_id) or self.load(task_id) or snap
        return snap

    def model_created(self) -> dict[str, int]:
        """Each model a request may name (served whole, or in parts that a chain of this node
        can use) -> when it was first offered (Unix seconds)."""
        return self.chains.model_created()

    def agent_created(self) -> dict[str, int]:
        """Each agent name on a live card in the ledger -> when first signed (Unix seconds)."""
        return agent_created(self.ctx.services.get("ledger"))

    def known_models(self) -> set[str]:
        return set(self.model_created())

    def place(self, model: str) -> Placement:
        """Where a request for ``model`` runs: the market, a chain, or nowhere (why)."""
        return self.chains.place(model)

    def live_text(self, task_id: str) -> AsyncIterator[str] | None:
        """A running task's text as it grows: a chain's, or the one a k=1 market task's
        executor streams (None: neither)."""
        chain = self.chains.live_text(task_id)
        if chain is not None:
            return chain
        task = self._machine.tasks.get(bytes.fromhex(task_id))
        if task is None or task.finished or task.spec.k != 1:
            return None
        return self.live.follow(task.spec.task_id)

    def status(self) -> dict[str, Any]:
        m = self._machine
        return {"open": len(m.open_tasks()), "selector": self.section.selector,
                "restored": self._restored, "counters": dict(sorted(m.counters.items())),
                "plans": dict(sorted(self._requester.pipeline.counters.items()))}

    def routes(self) -> list[Any]:
        return task_routes(self)

    def root_routes(self) -> list[Any]:
        return openai_routes(self)
