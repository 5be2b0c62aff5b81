"""Commitment-based verification in the daemon: the verifier role and the message routing.

* ``[verify] enabled = true`` (the default) makes this node's requester a
  ``protocol.verification.requester.VerifiedAuction`` and its executor a ``VerifiedExecutor``
  (node/market/requester.py and node/market/executor.py build their machines with
  :func:`requester_machine` and :func:`executor_machine`). Leave it on on every node of a
  network: a verifying requester refuses uncommitted results, and a verifying executor waits
  ``terms_grace_ms`` for Terms. It is on by default because committing is nearly free: a
  llama.cpp executor commits to the layer states of its own generation (models.llama_capture,
  ~2% of the generation time), where it used to pay an extra fp32 prefill (~0.3).
* This service owns the verification messages (tags 70-79). Its machine (:class:`VerifyRouter`)
  forwards ``Terms`` / ``RevealRequest`` to the executor machine and ``Commit`` / ``Reveal`` /
  ``Verdict`` to the tasks machine (``Forward`` effects, performed with ``ctx.submit``), and
  runs the verifier role (``protocol.verification.verifier.Verifier``) on ``CheckRequest``.
* The verifier role (``[verify] verifier = true``, needs the model) re-runs checks with
  models/checks.py in a worker thread (``trio.to_thread``); the model's weights are hashed at
  start (the role is advertised for that hash) and loaded at the first check; the machine's ledger
  attestations (verdicts) go to the ledger service, so ``symphony ledger attestations`` lists
  them. Verifier candidates for a requester are ledger peers advertising the verifier role
  with a model offer whose weights hash is the result's model hash, and a bidder the ledger
  shows convicted by others is excluded (both ``protocol.verification.candidates``, which the
  simulator calls too).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import trio

from node.agents.adapters import ADAPTERS_DIR, adapter_file
from node.sections import fed_config, tuning
from node.service import JobScopes, NodeContext, NurseryService
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.view import LedgerView
from protocol.machine import Effect, Received
from protocol.market.auction import Auction, AuctionConfig, AuctionOptions
from protocol.market.executor import Executor, ExecutorConfig
from protocol.market.selection import Selector
from protocol.verification.candidates import verified_auction
from protocol.verification.executor import VerifiedExecutor
from protocol.verification.messages import TO_EXECUTOR, TO_REQUESTER, TO_VERIFIER
from protocol.verification.requester import VerifiedAuction
from protocol.verification.state import VerifyConfig
from protocol.verification.verifier import (
    CancelCheck,
    CheckDone,
    CheckFailed,
    StartCheck,
    Verifier,
    VerifierConfig,
)

MAX_FAILURE_TEXT = 120
#: how long a check waits for the relay to bring the executor's adapter (a node that does not
#: hold it declines after this, and the requester asks another verifier)
ADAPTER_WAIT_S = 30.0


@tuning(VerifyConfig, "sample_rate", "verifiers", "panel", "max_escalations",
        "chunks_per_check", "commit_window_ms", "reveal_ms", "check_timeout_ms", "exclusion_ms",
        "require_fingerprints")
class VerifySection:
    """Tunables of verification (``[verify]`` in node.toml); see protocol/verification/requester.py."""

    #: commit/reveal and sampled checks for this node's tasks and executions
    enabled: bool = True
    #: serve the verifier role (re-run others' checks); needs the model below
    verifier: bool = True
    #: model for checks: registry name, .gguf path or HF dir ("" = the default model)
    model: str = ""
    #: checks computed at once (more wait in a queue)
    slots: int = 1

    def __post_init__(self) -> None:
        self.verify_config()  # raises ValueError for bad values
        if self.slots < 1:
            raise ValueError("slots must be >= 1")

    def verify_config(self) -> VerifyConfig:
        return fed_config(self)


def _section(ctx: NodeContext) -> VerifySection | None:
    try:
        section = ctx.config.section(VerifyService.name)
    except (KeyError, AttributeError):
        return None
    return section if isinstance(section, VerifySection) else None


def ledger_view(ctx: NodeContext) -> LedgerView | None:
    """The ledger service's view, when this node runs one (read at each call: services start
    in any order)."""
    return getattr(getattr(ctx.services.get("ledger"), "machine", None), "view", None)


def requester_machine(ctx: NodeContext, selector: Selector, config: AuctionConfig,
                      options: AuctionOptions) -> Auction | VerifiedAuction:
    """The tasks service's machine: a VerifiedAuction when verification is enabled; the
    auction's options go to its constructor whole, as in simulations/machines/."""
    section = _section(ctx)
    if section is None or not section.enabled:
        return Auction(ctx.identity, selector, ctx.rng, config, options)
    return verified_auction(ctx.identity, selector, ctx.rng, config, options,
                            section.verify_config(), functools.partial(ledger_view, ctx))


def executor_machine(ctx: NodeContext, config: ExecutorConfig) -> Executor:
    """The executor service's machine: a VerifiedExecutor when verification is enabled."""
    section = _section(ctx)
    if section is None or not section.enabled:
        return Executor(ctx.identity, config)
    return VerifiedExecutor(ctx.identity, config, ctx.rng)  # the protocol's Terms grace


@dataclass(frozen=True, slots=True)
class Forward:
    """Hand ``event`` to service ``service``'s machine."""

    service: str
    event: object


class VerifyRouter:
    """This service's machine: routing plus the verifier role (None when not a verifier)."""

    def __init__(self, verifier: Verifier | None) -> None:
        self.verifier = verifier

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            msg = event.message
            if isinstance(msg, TO_EXECUTOR):
                return [Forward("executor", event)]
            if isinstance(msg, TO_REQUESTER):
                return [Forward("tasks", event)]
            if not isinstance(msg, TO_VERIFIER) or self.verifier is None:
                return []
        if self.verifier is None:
            return []
        return self.verifier.handle(event, now)

    def next_deadline(self) -> int | None:
        return self.verifier.next_deadline() if self.verifier is not None else None


class VerifyService(NurseryService):
    name: ClassVar[str] = "verify"
    message_types = (*TO_EXECUTOR, *TO_REQUESTER, *TO_VERIFIER)
    config_section = VerifySection

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.section: VerifySection = ctx.config.section(self.name)
        self._machine = VerifyRouter(None)
        self.runner: Any = None
        self.problem = ""
        self._jobs = JobScopes()
        self.checked = 0
        self._warming = False

    @property
    def machine(self) -> VerifyRouter:
        return self._machine

    async def start(self) -> None:
        if self.section.enabled:  # an executor here keeps layer states: serve them
            try:
                from models.state_store import STATES_DIR, StateStore
                from node.verification.state_streams import serve_states, states_protocol
            except ImportError as exc:  # installed without the models extra: no states here
                self.ctx.log.warning("verify.no_states", error=str(exc))
            else:
                store = StateStore.shared(self.ctx.data_dir / STATES_DIR)
                self.ctx.transport.set_stream_handler(
                    states_protocol(self.ctx.network_id),
                    serve_states(store, self.ctx.config.sections.get("limits")))
        if not (self.section.enabled and self.section.verifier):
            self.problem = "verification off ([verify] enabled / verifier)"
            return
        from models.checks import CheckRunner

        try:
            self.runner = await trio.to_thread.run_sync(functools.partial(
                CheckRunner.load, self.section.model, deferred=True))
        except Exception as exc:  # no model here: route messages, verify nothing
            self.problem = f"no model for checks: {exc}"[:200]
            self.ctx.log.warning("verify.no_model", error=str(exc))
            return
        self._machine.verifier = Verifier(self.ctx.identity, VerifierConfig(
            model_hashes=frozenset({self.runner.model_hash}), slots=self.section.slots))
        self.ctx.log.info("verify.ready", model_hash=self.runner.model_hash.hex())

    async def on_running(self) -> None:
        executor = self.ctx.services.get("executor")
        if getattr(executor, "solver", None) is not None:
            self.warm_soon()

    def warm_soon(self) -> None:
        """Load the check model in the background now, once, instead of at the first check.

        Done as the service runs on a node whose executor serves a model: it executes in a
        verifying network, where each result is checked with probability ``sample_rate`` by
        ``verifiers`` peers, so checks are coming its way, and a check that must first load
        the model (importing torch and transformers, dequantizing the GGUF) outlasted the
        requester's ``check_timeout_ms`` on a busy machine: every verifier asked timed out,
        the result was undecided and its task waited for a replacement. A node that does not
        execute (a light node) still loads nothing until it is asked."""
        if self._warming or self.runner is None or not self.running:
            return
        self._warming = True
        self.start_soon(self._warm)

    async def _warm(self) -> None:
        try:  # abandoned on cancel: a stopping daemon does not wait for the load
            await trio.to_thread.run_sync(self.runner.warm, abandon_on_cancel=True)
        except Exception as exc:  # the first check will try again, and say why it fails
            self.ctx.log.warning("verify.warm_failed", error=f"{type(exc).__name__}: {exc}")
        else:
            self.ctx.log.info("verify.warmed")

    async def perform(self, effect: object) -> None:
        if isinstance(effect, Forward):
            if effect.service in self.ctx.services:
                await self.ctx.submit(effect.service, effect.event)
        elif isinstance(effect, LedgerAttest):
            await submit_attestation(self.ctx, effect)
        elif isinstance(effect, StartCheck):
            if not self.running or self.runner is None:
                await self.ctx.submit(self.name, CheckFailed(effect.check_id, "no checker"))
                return
            scope = self._jobs.open(effect.check_id)
            self.start_soon(self._check, effect, scope)
        elif isinstance(effect, CancelCheck):
            self._jobs.cancel(effect.check_id)
        else:
            await super().perform(effect)

    async def _check(self, job: StartCheck, scope: trio.CancelScope) -> None:
        event: object
        with scope:
            try:
                if job.states_root:
                    event = await self._check_layers(job)
                else:
                    event = await trio.to_thread.run_sync(self.runner.run, job,
                                                          abandon_on_cancel=True)
                self.checked += 1
            except Exception as exc:
                self.ctx.log.exception("verify.check_failed", check_id=job.check_id.hex())
                event = CheckFailed(job.check_id, f"{type(exc).__name__}: {exc}"
                                    [:MAX_FAILURE_TEXT])
        self._jobs.close(job.check_id)
        if not scope.cancelled_caught:
            await self.ctx.submit(self.name, event)

    async def _check_layers(self, job: StartCheck) -> object:
        """Fetch the sampled leaves of the executor's layer states, then re-run the layers.

        A leaf that is missing, malformed or not under the committed root fails the check
        (the executor committed to it); an executor that cannot be reached at all is a
        declined check (the requester asks another verifier)."""
        from models.checks import LayerJob
        from node.verification.state_streams import (
            BadStates,
            StatesUnavailable,
            fetch_leaves,
            states_protocol,
        )

        prep = await trio.to_thread.run_sync(self.runner.prepare, job, abandon_on_cancel=True)
        if not isinstance(prep, LayerJob):
            return prep  # the binding checks already failed
        adapter = None
        if job.adapter:  # the executor's LoRA adapter, fetched as its executors fetch it
            adapter = await adapter_file(self.ctx.services.get("relay"),
                                         self.ctx.data_dir / ADAPTERS_DIR, job.adapter.hex(),
                                         ADAPTER_WAIT_S)
            if adapter is None:  # not to be had here: another verifier may hold it
                return CheckFailed(job.check_id, f"adapter {job.adapter.hex()[:16]} not "
                                   "available from the relay")
        try:
            fetched = await fetch_leaves(
                self.ctx.transport, states_protocol(self.ctx.network_id), job.executor,
                job.task.task_id, job.states_root, job.state_layers, prep.plan.total_tokens,
                prep.wanted)
        except BadStates as exc:
            return CheckDone(job.check_id, False, f"layer states: {exc}"[:MAX_FAILURE_TEXT])
        except StatesUnavailable as exc:  # unreachable, evicted or busy: inconclusive
            return CheckFailed(job.check_id, f"no layer states: {exc}"[:MAX_FAILURE_TEXT])
        return await trio.to_thread.run_sync(self.runner.run_layers, job, prep, fetched, adapter,
                                             abandon_on_cancel=True)

    def status(self) -> dict[str, Any]:
        v = self._machine.verifier
        return {"enabled": self.section.enabled, "verifier": v is not None,
                "problem": self.problem, "checked": self.checked,
                "sample_rate": self.section.sample_rate,
                "counters": dict(sorted(v.counters.items())) if v is not None else {}}


async def perform_verification_effect(ctx: NodeContext, effect: object) -> bool:
    """Perform an effect the VerifiedAuction adds to the auction's; False if not one of them."""
    if isinstance(effect, LedgerAttest):
        await submit_attestation(ctx, effect)
        return True
    return False


async def submit_attestation(ctx: NodeContext, effect: LedgerAttest) -> None:
    """A verification attestation (verdict, conviction, contradiction) into the ledger."""
    ctx.log.info("verify.attest", subject=effect.subject, kind=effect.kind.value,
                 object_id=effect.object_id.hex(), outcome=effect.outcome)
    if "ledger" in ctx.services:
        await ctx.submit("ledger", effect)
