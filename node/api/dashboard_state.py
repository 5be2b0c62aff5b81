"""What the dashboard shows: one JSON document of the node's state, rebuilt for each push.

``LiveFeed`` is a driver observer (node/api/observed.py) that remembers what the stored task
snapshots do not carry: the bids each task received and the verification decisions about its
executors, plus the latest observable events. It holds at most ``MAX_TASKS`` tasks and
``MAX_EVENTS`` events.

``dashboard_state(source, feed)`` assembles, from the daemon's ``/status``, the services and
the feed:

* ``node``: peer id, network, addresses, uptime, versions, served models, device, slots;
* ``peers``: connected peers with round-trip latency, reputation and attestations held;
* ``tasks``: recent tasks with bids, chosen executors (attempts), votes, verification, the
  agent that answered and every result's tool calls (name, arguments, output, shortened);
  a plan task's ``plan``: its tree (planners, steps, who ran them, tool calls, the vote:
  node/api/dashboard_plans.py), rebuilt at each push from the snapshot the pipeline stores
  as each step completes;
* ``agents``: the network's agents in this node's ledger, as ``GET /agents`` lists them
  (node/agents/api.py: name, node, skills, tools with their side effects, price,
  reputation, whether the card's vector was verified), at most ``AGENTS_SHOWN``;
* ``relay``: artifact versions being relayed, with chunks held of chunks in all;
* ``jobs``: one entry per heavier job kind (``inference``: distributed-inference chains,
  ``rl``: rollout jobs and workers), the status of each service of that kind this node runs
  (service name -> its status), or ``None`` where it runs none;
* ``inference`` and ``rl``: those kinds as the page draws them, with the figures derived from
  them (node/api/dashboard_jobs.py: stages and chains with tokens/s, an RL run's history by
  policy version), or ``None`` where the node runs no such service;
* ``totals``: running totals (tasks ended and their answers' tokens, tasks computed and
  tokens generated) with the node's clock ``at_ms`` (the driver's, monotonic: only differences
  mean anything), which the page turns into rates over time;
* ``events``: the latest events, newest first.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, Protocol

from node.agents.api import entry_json
from node.api.dashboard_jobs import RunHistory, Throughput, inference_view, rl_view
from node.api.dashboard_plans import plan_view
from protocol.machine import Emit

MAX_TASKS = 200
MAX_EVENTS = 40
#: tasks shown (newest first)
TASKS_SHOWN = 15
#: agents shown (best node reputation first)
AGENTS_SHOWN = 50
#: job kinds with a section of their own: kind -> the services that run it
JOB_SERVICES = {"inference": ("inference",), "rl": ("rl_jobs", "rl_worker")}
#: events not shown in the feed (routine, every few seconds with every peer)
QUIET_EVENTS = ("ledger.sync_end",)


class DashboardSource(Protocol):
    """What the dashboard reads of the daemon (node/daemon.py's ``Daemon`` is one)."""

    def status(self) -> dict[str, Any]: ...

    @property
    def services(self) -> Mapping[str, Any]: ...


class LiveFeed:
    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.bids: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.checks: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.runs = RunHistory()
        self.throughput = Throughput()
        #: bumped on every remembered change, so the pusher knows when to send
        self.version = 0

    def observe(self, service: str, item: object) -> None:
        if not isinstance(item, Emit):
            if self.throughput.observe(item):
                self.version += 1
            return
        fields = item.fields
        name = item.event
        if service == "rl_jobs":
            self.runs.observe(item, self.clock())
        if name == "task.bid":
            self._task_list(self.bids, str(fields["task_id"])).append(
                {"peer": fields.get("peer"), "match": fields.get("match"),
                 "price": fields.get("price")})
        elif name in ("verify.decided", "verify.verdict"):
            self._task_list(self.checks, str(fields["task_id"])).append(
                {"executor": fields.get("executor"), "verifier": fields.get("verifier"),
                 "outcome": fields.get("decision") or fields.get("status"),
                 "final": name == "verify.decided"})
        shown = f"{service}.{name}"  # as the daemon's log names it
        if shown in QUIET_EVENTS:
            return
        self.events.appendleft({"at_ms": self.clock(), "event": shown,
                                "fields": {k: _short(v) for k, v in fields.items()}})
        self.version += 1

    @staticmethod
    def _task_list(table: OrderedDict[str, list[dict[str, Any]]],
                   task_id: str) -> list[dict[str, Any]]:
        if task_id not in table:
            table[task_id] = []
            while len(table) > MAX_TASKS:
                table.popitem(last=False)
        return table[task_id]


def _short(value: object) -> object:
    if isinstance(value, str) and len(value) > 120:
        return value[:117] + "..."
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def dashboard_state(source: DashboardSource, feed: LiveFeed) -> dict[str, Any]:
    status = source.status()
    services = source.services
    return {
        "node": _node(status, services),
        "peers": _peers(status, services),
        "tasks": _tasks(services, feed),
        "agents": _agents(services),
        "relay": _relay(services),
        "jobs": {kind: ({n: services[n].status() for n in names if n in services} or None)
                 for kind, names in JOB_SERVICES.items()},
        "inference": inference_view(services.get("inference"), str(status.get("peer_id", ""))),
        "rl": rl_view(services, feed.runs),
        "totals": {**feed.throughput.totals, "at_ms": feed.clock()},
        "events": list(feed.events),
    }


def _node(status: dict[str, Any], services: Mapping[str, Any]) -> dict[str, Any]:
    executor = status.get("services", {}).get("executor", {})
    node = {key: status.get(key) for key in ("peer_id", "network_id", "addresses", "uptime_s",
                                             "versions", "state")}
    node["models"] = executor.get("models", [])
    node["slots"] = executor.get("slots")
    node["free_slots"] = executor.get("free_slots")
    node["executing"] = bool(executor.get("enabled"))
    node["device"] = None
    ledger = services.get("ledger")
    own = status.get("peer_id")
    if ledger is not None and own:
        held = ledger.machine.view.capability(own)
        if held is not None:
            hw = held.record.hardware
            node["device"] = {"kind": hw.device_kind, "name": hw.device_name,
                              "memory_bytes": hw.memory_bytes, "cpu_cores": hw.cpu_cores}
    return node


def _peers(status: dict[str, Any], services: Mapping[str, Any]) -> list[dict[str, Any]]:
    ledger = services.get("ledger")
    rows = []
    for peer in status.get("peers", []):
        pid = peer["peer_id"]
        row = {"peer_id": pid, "state": peer.get("state", "connected"),
               "latency_ms": peer.get("latency_ms"), "agent": peer.get("agent_version"),
               "connected_s": peer.get("connected_s"), "reputation": None,
               "attestations": 0, "models": []}
        if ledger is not None:
            view = ledger.machine.view
            row["reputation"] = {k: (round(v, 3) if isinstance(v, float) else v)
                                 for k, v in asdict(ledger.reputation(pid)).items()}
            row["attestations"] = len(view.attestations(subject=pid))
            held = view.capability(pid)
            if held is not None:
                row["models"] = [m.name for m in held.record.models]
        rows.append(row)
    return rows


def _tasks(services: Mapping[str, Any], feed: LiveFeed) -> list[dict[str, Any]]:
    tasks = services.get("tasks")
    if tasks is None:
        return []
    rows = []
    for snap in tasks.recent(TASKS_SHOWN):
        tid = snap["task_id"]
        rows.append({
            "task_id": tid, "phase": snap["phase"], "question": _short(snap["question"]),
            "k": snap["k"], "answer": snap.get("answer"), "failure": snap.get("failure"),
            "bids": feed.bids.get(tid, []),
            "executors": [{"peer": a["peer"], "state": a["state"], "price": a["price"],
                           "est_latency_ms": a["est_latency_ms"]} for a in snap["attempts"]],
            "votes": [{"answer": _short(v["answer"]), "count": v["count"],
                       "share": v["share"]} for v in snap["votes"]],
            "verification": feed.checks.get(tid, []),
            "agent": snap.get("agent"),
            # a plan task's tree (node/api/dashboard_plans.py), None for any other task
            "plan": plan_view(snap, tasks.load) if snap.get("mode") == "plan" else None,
            "tool_calls": [{"executor": r["executor"], "name": c["name"],
                            "arguments": _short(json.dumps(c["arguments"], sort_keys=True)),
                            "output": _short(c["output"])}
                           for r in snap.get("results", []) for c in r.get("tool_calls") or []],
        })
    return rows


def _agents(services: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The network's agents as ``GET /agents`` lists them (node/agents/api.py)."""
    ledger = services.get("ledger")
    if ledger is None or getattr(ledger, "agents", None) is None:
        return []
    entries = sorted(ledger.agents.entries(), key=lambda e: (-e.reputation, e.peer_id))
    return [entry_json(e) for e in entries[:AGENTS_SHOWN]]


def _relay(services: Mapping[str, Any]) -> list[dict[str, Any]]:
    relay = services.get("relay")
    if relay is None:
        return []
    return [{key: v[key] for key in ("name", "version", "state", "held", "chunks", "total_size",
                                     "source", "parent", "children")}
            for v in relay.status().get("versions", [])]
