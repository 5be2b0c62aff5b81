"""The dashboard's views of the heavier job kinds and of the node's throughput.

What the page draws needs a few figures the services' statuses do not carry as such; they are
derived here, from the services and from what the driver shows its observers:

* :func:`inference_view`: the model's block servers as *stages* (this node's own offer
  included), each with its measured milliseconds per block and the tokens per second that
  makes for its range (``1000 / (blocks * ms_per_block)``, one token through every block of
  the stage), the ping round trip to it, and the *chain* this node would plan now
  (protocol.inference.routing.plan_chain over the same servers and round trips the requester
  uses), with its expected milliseconds per token (each hop's compute plus its round trip, the
  planner's ``DEFAULT_RTT_MS`` where no ping was measured) and the tokens per second that
  gives. Blocks no one serves are listed as ``missing``.
* :func:`rl_view`: the learner's job book (policy version, staleness bound, jobs in flight,
  groups waiting and dropped, excluded workers, counters), the rollout worker (versions held,
  slots busy, groups generated, adapters followed) and the run's history by policy version:
  when the learner published it (``published_at_ms``, on the driver's monotonic clock, as
  ``totals.at_ms``), the groups accepted while it was trained with their
  staleness (trained version minus the group's version) and the groups refused as stale.
  A learner's reward and held-out accuracy per step are shown where the ``rl_jobs`` status
  carries them (``steps``: ``{"version", "mean_reward", "heldout_accuracy"}``); the daemon
  does not compute rewards itself: the learner sends its step's figures with each version it
  publishes (``POST /rl_jobs/version``, node/rl/rollout_jobs.py).
* :class:`Throughput`: running totals the page turns into rates over time: tasks this node
  asked that ended and the tokens of the results they received, tasks its executor computed
  and the tokens it generated.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from protocol.inference.routing import DEFAULT_RTT_MS, NoRoute, Server, plan_chain
from protocol.machine import Emit
from protocol.market.events import ComputeDone, TaskUpdated

#: policy versions of an RL run remembered (oldest forgotten first)
MAX_RL_VERSIONS = 100
#: learner steps shown (the newest)
MAX_RL_STEPS = 200
#: finished tasks remembered so a task counts once however often its snapshot is shown again
MAX_ENDED_TASKS = 1000
#: the job book's fields the page shows
RL_JOB_FIELDS = ("version", "staleness", "in_flight", "waiting_groups", "dropped_groups",
                 "excluded", "book", "counters")
RL_WORKER_FIELDS = ("enabled", "problem", "model", "versions", "busy", "slots", "generated",
                    "failed", "counters", "adapters")


def tokens_per_s(ms_per_token: float) -> float | None:
    """Tokens per second of a stage or chain that takes ``ms_per_token`` per token."""
    return round(1000.0 / ms_per_token, 2) if ms_per_token > 0 else None


def inference_view(service: Any, own_peer: str) -> dict[str, Any] | None:
    """The inference section (see the module doc); None where the node runs no such service."""
    if service is None:
        return None
    status = service.status()
    model, n_blocks = service.model_name, service.n_blocks
    servers = [s for s in service.chain_servers() if s.model == model] if model else []
    rtts = {**service.rtt_ms(), own_peer: 0.0}
    stages = [_stage(s, own_peer, rtts) for s in sorted(servers, key=lambda s: (s.start, s.peer))]
    chain, problem = None, None
    if servers and n_blocks:
        try:
            hops = plan_chain(servers, model, 0, n_blocks, rtt_ms=rtts)
        except NoRoute as exc:
            problem = f"no chain covers the model: {exc}"
        else:
            chain = _chain(hops, servers, rtts, own_peer)
    return {"model": model, "n_blocks": n_blocks, "serving": status["serving"],
            "blocks": status["blocks"], "ms_per_block": status["ms_per_block"],
            "sessions": status["sessions"], "forwards": status["forwards"],
            "problem": status["problem"] or None, "stages": stages, "chain": chain,
            "chain_problem": problem, "missing": [list(r) for r in service.missing()]}


def _stage(s: Server, own_peer: str, rtts: Mapping[str, float]) -> dict[str, Any]:
    blocks = s.end - s.start
    return {"peer": s.peer, "self": s.peer == own_peer, "start": s.start, "end": s.end,
            "ms_per_block": round(s.ms_per_block, 3),
            "tokens_per_s": tokens_per_s(blocks * s.ms_per_block),
            "free_sessions": s.free_sessions, "max_sessions": s.max_sessions,
            "rtt_ms": None if s.peer not in rtts else round(rtts[s.peer], 1)}


def _chain(hops: list[Any], servers: list[Server], rtts: Mapping[str, float],
           own_peer: str) -> dict[str, Any]:
    rows, total = [], 0.0
    for hop in hops:
        server = next(s for s in servers if s.peer == hop.peer and s.start <= hop.start
                      and hop.end <= s.end)
        compute = (hop.end - hop.start) * server.ms_per_block
        rtt = rtts.get(hop.peer, DEFAULT_RTT_MS)
        total += compute + rtt
        rows.append({"peer": hop.peer, "self": hop.peer == own_peer, "start": hop.start,
                     "end": hop.end,
                     "compute_ms": round(compute, 3), "rtt_ms": round(rtt, 1),
                     "rtt_measured": hop.peer in rtts,
                     "tokens_per_s": tokens_per_s(compute)})
    return {"hops": rows, "ms_per_token": round(total, 3), "tokens_per_s": tokens_per_s(total)}


class RunHistory:
    """An RL run's history by policy version, from the ``rl_jobs`` service's events
    (protocol/rl/auction.py: ``rl.version``, ``rl.accepted``, ``rl.stale``)."""

    def __init__(self) -> None:
        self.versions: OrderedDict[int, dict[str, Any]] = OrderedDict()

    def observe(self, emit: Emit, now_ms: int) -> None:
        fields = emit.fields
        if emit.event == "rl.version":
            self._version(fields.get("version"))["published_at_ms"] = now_ms
        elif emit.event in ("rl.accepted", "rl.stale"):
            trained, made = fields.get("training"), fields.get("version")
            row = self._version(trained)
            if emit.event == "rl.stale":
                row["stale"] += 1
            elif isinstance(trained, int) and isinstance(made, int):
                row["accepted"] += 1
                lag = str(trained - made)
                row["staleness"][lag] = row["staleness"].get(lag, 0) + 1

    def _version(self, version: object) -> dict[str, Any]:
        key = version if isinstance(version, int) and not isinstance(version, bool) else -1
        if key not in self.versions:
            self.versions[key] = {"version": key, "published_at_ms": None, "accepted": 0,
                                  "stale": 0, "staleness": {}}
            while len(self.versions) > MAX_RL_VERSIONS:
                self.versions.popitem(last=False)
        return self.versions[key]

    def rows(self) -> list[dict[str, Any]]:
        return [self.versions[v] for v in sorted(self.versions)]


def rl_view(services: Mapping[str, Any], history: RunHistory) -> dict[str, Any] | None:
    """The RL section (see the module doc); None where the node runs no RL service."""
    jobs, worker = services.get("rl_jobs"), services.get("rl_worker")
    if jobs is None and worker is None:
        return None
    learner = None
    steps: list[dict[str, Any]] = []
    if jobs is not None:
        status = jobs.status()
        learner = {key: status.get(key) for key in RL_JOB_FIELDS}
        steps = [_step(s) for s in (status.get("steps") or [])[-MAX_RL_STEPS:]]
    shown = None
    if worker is not None:
        status = worker.status()
        shown = {key: status.get(key) for key in RL_WORKER_FIELDS}
    return {"learner": learner, "worker": shown, "versions": history.rows(), "steps": steps}


def _step(step: Mapping[str, Any]) -> dict[str, Any]:
    return {"version": step.get("version"), "mean_reward": step.get("mean_reward"),
            "heldout_accuracy": step.get("heldout_accuracy")}


class Throughput:
    """Running totals of the work this node asked for and did (see the module doc)."""

    def __init__(self) -> None:
        self.totals = {"tasks_ended": 0, "answer_tokens": 0, "tasks_computed": 0,
                       "tokens_generated": 0}
        self._ended: OrderedDict[str, None] = OrderedDict()

    def observe(self, item: object) -> bool:
        """Count ``item``; True when a total changed."""
        if isinstance(item, ComputeDone):
            self.totals["tasks_computed"] += 1
            self.totals["tokens_generated"] += max(0, item.tokens)
            return True
        if not isinstance(item, TaskUpdated) or item.snapshot.phase not in ("done", "failed"):
            return False
        task_id = item.snapshot.task_id
        if task_id in self._ended:
            return False
        self._ended[task_id] = None
        while len(self._ended) > MAX_ENDED_TASKS:
            self._ended.popitem(last=False)
        results = item.snapshot.data.get("results")
        self.totals["tasks_ended"] += 1
        self.totals["answer_tokens"] += sum(
            max(0, int(r.get("tokens") or 0)) for r in results if isinstance(r, dict)
        ) if isinstance(results, list) else 0
        return True
