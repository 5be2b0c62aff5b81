"""The learner's rollout-job market in the daemon (``[rl_jobs]``): drives protocol/rl/auction.py.

* Owns ``RolloutBid``, ``RolloutResult`` and ``RolloutReject``. Jobs are issued in the job book
  (protocol/rl/jobs.py) of the current *run* (model, prompts, G, sampling, staleness S), whose
  defaults come from this section and which the learner may set again with ``POST /rl_jobs/run``
  while no worker runs one of its jobs (jobs still waiting for bids are dropped with the run).
* Accepted groups wait in a bounded queue (``max_groups``; the oldest is dropped and counted
  past it) for the learner to take with ``GET /rl_jobs/groups`` or :meth:`take_groups`.
  Attestations go to the ledger service as the task market's do; reputation for selection
  comes from the ledger's trust view (0.5 for everyone without a ledger), and workers never
  picked get a bounded share of the picks (``explore_share``).
* The run (its fields, version, excluded workers and open jobs) is kept in the daemon's SQLite
  (node/rl/rollout_state.py): a restarted daemon resumes it and issues its open jobs again.

Routes under ``/rl_jobs`` (POST ones need the API token):

* ``POST /run`` JSON: any of ``model``, ``dataset_size``, ``vocab_size``, ``group_size``,
  ``prompts_per_job``, ``max_tokens``, ``temperature``, ``top_p``, ``staleness``, ``job_ms``,
  ``version``: a new run (409 while workers run its jobs; 400 naming a bad field);
* ``POST /issue`` ``{"count": n, "version": v?}``;
* ``POST /version`` ``{"version": w, "mean_reward": r?, "heldout_accuracy": a?}``: the learner
  published ``w``; the figures of its step are kept (node/rl/step_figures.py) as ``steps``;
* ``POST /convict`` ``{"job_id": hex, "reason": text}``: a check the learner ran on an accepted
  group failed (log-prob recomputation): its worker is attested, excluded, the job reissued;
* ``GET /groups?max=N&wait_s=S``: up to N accepted groups (waiting up to S s for the first),
  each with its worker, version, prompt indices and completions (token ids, log-probs).
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any, ClassVar

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from node.api.app import json_object, token_route
from node.rl import rollout_state
from node.rl.step_figures import StepFigures, telemetry, version_figures
from node.sections import fed_config, feed, tuning
from node.service import NodeContext, Service
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.ledger.trust import TrustView
from protocol.market.attestations import ledger_attestation
from protocol.market.events import Attest
from protocol.market.linucb import LinUCBSelector
from protocol.market.messages import MAX_REASON_LEN, TASK_ID_LEN
from protocol.market.selection import EXPLORE_SHARE, ExploringSelector, ScoreSelector, Selector
from protocol.rl.auction import AuctionSettings, RolloutAuction
from protocol.rl.events import Convict, GroupAccepted, IssueJobs, PublishVersion
from protocol.rl.jobs import BookConfig, JobBook, JobState
from protocol.rl.messages import (
    RolloutBid,
    RolloutReject,
    RolloutResult,
    RolloutResultBody,
    RolloutSampling,
)
from protocol.rl.staleness import accepts

MAX_ISSUE = 1024
MAX_WAIT_S = 30.0


@tuning(AuctionSettings, "bid_window_ms",
        # the job book's: prompts and completions per job, a job's time, the staleness bound S
        also=feed(BookConfig, "group_size", "prompts_per_job", "job_ms",
                  staleness="max_staleness"))
class RlJobsSection:
    """Defaults of a rollout run (``[rl_jobs]`` in node.toml); ``POST /rl_jobs/run`` overrides."""

    model: str = "default"
    #: prompts in the learner's environment (0: the learner must start a run first)
    dataset_size: int = 0
    vocab_size: int = 49_152
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    max_groups: int = 4096
    #: "score" (the market's weighted score) or "linucb" (the bandit, rewarded 1 for an
    #: accepted group and 0 for a caught one; its state lives for the daemon's life)
    selector: str = "score"
    #: share of picks given to workers never picked before (protocol/market/selection.py's
    #: ExploringSelector): without it, once workers have a record a newcomer is never picked
    explore_share: float = EXPLORE_SHARE

    def __post_init__(self) -> None:
        for name in ("vocab_size", "group_size", "prompts_per_job", "max_tokens", "job_ms",
                     "bid_window_ms", "max_groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.dataset_size < 0 or self.staleness < 0:
            raise ValueError("dataset_size and staleness must not be negative")
        if not 0.0 <= self.explore_share <= 1.0:
            raise ValueError(f"explore_share must be in [0, 1], got {self.explore_share}")
        if self.selector not in ("score", "linucb"):
            raise ValueError(f"selector must be 'score' or 'linucb', got {self.selector!r}")


#: fields of a run a learner may set, and their types
RUN_FIELDS = {"model": str, "dataset_size": int, "vocab_size": int, "group_size": int,
              "prompts_per_job": int, "max_tokens": int, "temperature": float, "top_p": float,
              "staleness": int, "job_ms": int, "version": int}


def run_auction(ctx: NodeContext, section: RlJobsSection, version: int,
                reputation: Any) -> RolloutAuction:
    """A fresh auction and job book for a run described by ``section``."""
    sampling = RolloutSampling(temperature=section.temperature, top_p=section.top_p,
                               max_tokens=section.max_tokens)
    sampling.check()
    config = fed_config(section, BookConfig, learner=ctx.identity.peer_id, model=section.model,
                        dataset_size=max(1, section.dataset_size),
                        vocab_size=section.vocab_size, sampling=sampling)
    book = JobBook(config, random.Random(ctx.rng.getrandbits(64)), version=version)
    settings = fed_config(section)
    inner: Selector = LinUCBSelector() if section.selector == "linucb" else ScoreSelector()
    selector = ExploringSelector(inner, share=section.explore_share)
    return RolloutAuction(ctx.identity, book, selector, reputation, settings)


def group_json(body: RolloutResultBody) -> dict[str, Any]:
    return {"job_id": body.job_id.hex(), "worker": body.worker, "version": body.policy_version,
            "prompt_indices": list(body.prompt_indices), "compute_ms": body.compute_ms,
            "commitment": body.commitment.hex(),
            "completions": [{"token_ids": list(c.token_ids), "logprobs": list(c.logprobs),
                             "finished": c.finished, "fingerprint": c.fingerprint.hex()}
                            for c in body.completions]}


class RolloutJobsService(Service):
    name: ClassVar[str] = "rl_jobs"
    message_types = (RolloutBid, RolloutResult, RolloutReject)
    config_section = RlJobsSection
    schema = rollout_state.SCHEMA

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.section: RlJobsSection = ctx.config.section(self.name)
        self.run_section = self.section
        self.run_fields: dict[str, Any] = {}  # what the learner set over the section
        self._reopen: dict[str, int] = {}  # open jobs of a restored run, per version
        self._auction = run_auction(ctx, self.section, 0, self.reputation)
        self.groups: collections.deque[RolloutResultBody] = collections.deque()
        self.dropped = 0
        self.steps = StepFigures()
        self._arrived = trio.Event()
        self._trust_view: TrustView | None = None

    @property
    def machine(self) -> RolloutAuction:
        return self._auction

    def reputation(self, peer: str) -> float:
        view = getattr(getattr(self.ctx.services.get("ledger"), "machine", None), "view", None)
        if view is None:
            return 0.5
        if self._trust_view is None or self._trust_view.view is not view:
            self._trust_view = TrustView(view)
        return self._trust_view.record(peer, self.ctx.clock())

    # ------------------------------------------------------------ the run across restarts
    async def start(self) -> None:
        try:
            state = rollout_state.load(self.ctx.db)
            if state is not None:
                self._restore(state)
        except (ValueError, TypeError, InvalidMessage) as exc:  # a new run, said so
            self.ctx.log.warning("rl_jobs.state_unreadable", error=str(exc))

    def _restore(self, state: dict[str, Any]) -> None:
        run = state["run"]
        unknown = sorted(set(run) - set(RUN_FIELDS) | ({"version"} & set(run)))
        if unknown:
            raise ValueError(f"rl_jobs_state names unknown run fields {unknown}")
        section = dataclasses.replace(self.section, **run)
        self._auction = run_auction(self.ctx, section, state["version"], self.reputation)
        self.run_section, self.run_fields = section, dict(run)
        self._auction.book.excluded.update(str(w) for w in state["excluded"])
        self._reopen = dict(state["open"])
        self.ctx.log.info("rl_jobs.resumed", version=state["version"], open=self._reopen,
                          excluded=len(state["excluded"]))

    async def on_running(self) -> None:
        """The jobs a restored run had open are issued again, for versions still in bounds."""
        book, reopen = self._auction.book, self._reopen
        self._reopen = {}
        for version, count in sorted(reopen.items()):
            if count and accepts(int(version), book.version, book.config.max_staleness):
                await self.ctx.submit(self.name, IssueJobs(min(count, MAX_ISSUE), int(version)))
        self.save()

    def save(self) -> None:
        rollout_state.save(self.ctx.db, rollout_state.snapshot(self.run_fields,
                                                               self._auction.book))

    async def perform(self, effect: object) -> None:
        if isinstance(effect, GroupAccepted):
            if len(self.groups) >= self.section.max_groups:
                self.groups.popleft()
                self.dropped += 1
            self.groups.append(effect.result)
            self._arrived.set()
            self.save()
        elif isinstance(effect, Attest):
            self.ctx.log.info("rl_jobs.attest", subject=effect.subject, outcome=effect.outcome,
                              job_id=effect.task_id.hex(), detail=effect.detail)
            self.save()
            if "ledger" in self.ctx.services:
                await self.ctx.submit("ledger", ledger_attestation(effect))
        else:
            await super().perform(effect)

    # ------------------------------------------------------------ the learner's interface
    def begin(self, fields: dict[str, Any]) -> None:
        """A new run with ``fields`` over the section's defaults (see ``RUN_FIELDS``);
        ``ValueError`` names a bad field, ``LocalProtocolError`` while workers run its jobs."""
        for key, value in fields.items():
            kind = RUN_FIELDS.get(key)
            if kind is None:
                raise ValueError(f"unknown run field {key!r}; known: {sorted(RUN_FIELDS)}")
            if type(value) is not kind and not (kind is float and type(value) is int):
                raise ValueError(f"{key} must be a {kind.__name__}, got {value!r}")
        if any(r.state is JobState.RUNNING for r in self._auction.book.jobs.values()):
            raise LocalProtocolError("a run cannot change while workers run its jobs")
        version = int(fields.pop("version", self._auction.book.version))
        section = dataclasses.replace(self.section, **fields)
        if section.dataset_size < 1:
            raise ValueError("dataset_size must be >= 1 for a run")
        try:
            self._auction = run_auction(self.ctx, section, version, self.reputation)
        except InvalidMessage as exc:
            raise ValueError(str(exc)) from None
        self.run_section, self.run_fields = section, fields
        self.steps.forget_after(version)
        self.save()

    async def issue(self, count: int, version: int | None = None) -> None:
        if self.run_section.dataset_size < 1:
            raise ValueError("no run: set dataset_size in [rl_jobs] or POST /rl_jobs/run")
        if not 1 <= count <= MAX_ISSUE:
            raise ValueError(f"count must be in [1, {MAX_ISSUE}], got {count}")
        await self.ctx.submit(self.name, IssueJobs(count, version))
        self.save()

    async def publish(self, data: dict[str, Any]) -> int:
        """The version the learner published and its step's figures (``POST /version``'s
        body); ``ValueError`` names a bad field."""
        version, reward, accuracy = version_figures(data, self._auction.book.version)
        measured = telemetry(data)
        await self.ctx.submit(self.name, PublishVersion(version))
        if reward is not None:
            self.steps.record(version, reward, accuracy, measured)
        self.save()
        return version

    async def take_groups(self, most: int, wait_s: float) -> list[RolloutResultBody]:
        if not self.groups and wait_s > 0:
            self._arrived = trio.Event()
            with trio.move_on_after(min(wait_s, MAX_WAIT_S)):
                await self._arrived.wait()
        out: list[RolloutResultBody] = []
        while self.groups and len(out) < most:
            out.append(self.groups.popleft())
        return out

    def status(self) -> dict[str, Any]:
        book = self._auction.book
        return {"version": book.version, "in_flight": book.in_flight(),
                "excluded": sorted(book.excluded), "waiting_groups": len(self.groups),
                "dropped_groups": self.dropped, "staleness": book.config.max_staleness,
                "book": dict(sorted(book.counters.items())),
                "counters": dict(sorted(self._auction.counters.items())),
                "steps": self.steps.rows()}

    def routes(self) -> list[BaseRoute]:
        return rollout_routes(self)


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": message}, status_code=status)


def rollout_routes(service: RolloutJobsService) -> list[BaseRoute]:
    async def post_run(request: Request) -> Response:
        data = await json_object(request)
        if data is None:
            return _error("expected a JSON object")
        try:
            service.begin(data)
        except ValueError as exc:
            return _error(str(exc))
        except LocalProtocolError as exc:
            return _error(str(exc), 409)
        return JSONResponse(service.status())

    async def post_issue(request: Request) -> Response:
        data = await json_object(request)
        count, version = (data or {}).get("count"), (data or {}).get("version")
        if type(count) is not int or (version is not None and type(version) is not int):
            return _error("expected {\"count\": int, \"version\": int (optional)}")
        try:
            await service.issue(count, version)
        except (ValueError, LocalProtocolError) as exc:
            return _error(str(exc))
        return JSONResponse({"issued": count})

    async def post_version(request: Request) -> Response:
        try:
            version = await service.publish(await json_object(request) or {})
        except ValueError as exc:
            return _error(str(exc))
        return JSONResponse({"version": version})

    async def post_convict(request: Request) -> Response:
        data = await json_object(request) or {}
        job_id, reason = data.get("job_id"), data.get("reason")
        try:
            raw = bytes.fromhex(job_id) if isinstance(job_id, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != TASK_ID_LEN or not isinstance(reason, str) or not reason:
            return _error("expected {\"job_id\": 64 hex digits, \"reason\": text}")
        await service.ctx.submit(service.name, Convict(raw, reason[:MAX_REASON_LEN]))
        service.save()
        return JSONResponse({"excluded": sorted(service.machine.book.excluded)})

    async def get_groups(request: Request) -> Response:
        try:
            most = int(request.query_params.get("max", "64"))
            wait_s = float(request.query_params.get("wait_s", "0"))
        except ValueError:
            return _error("max must be an int and wait_s a number")
        if most < 1 or not 0 <= wait_s <= MAX_WAIT_S:
            return _error(f"max must be >= 1 and wait_s in [0, {MAX_WAIT_S}]")
        groups = await service.take_groups(most, wait_s)
        return JSONResponse({"groups": [group_json(g) for g in groups]})

    return [token_route("/run", post_run), token_route("/issue", post_issue),
            token_route("/version", post_version), token_route("/convict", post_convict),
            token_route("/groups", get_groups, methods=("GET",))]
