"""Prometheus metrics of one daemon, served at ``GET /metrics`` (text format 0.0.4).

Each daemon has its own ``CollectorRegistry`` (never prometheus_client's global one: tests run
several daemons in one process). Like ``/status`` the route is open to local readers: it is
bound to 127.0.0.1 and reveals nothing a local ``/status`` does not.

Two kinds of values:

* counted as they happen, from what the driver shows its observers (node/api/observed.py):
  messages per service and type, penalties and bans, task outcomes and latency, tokens
  generated, verification outcomes;
* read when scraped, from the driver and the services: peers, ledger size, relay traffic.

``METRICS`` below lists every name with its meaning (the README's table is made from it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from node.api.observed import PenaltyNoted
from protocol.machine import Emit, Publish, Received, Send
from protocol.market.events import ComputeDone

PREFIX = "symphony"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: task latency buckets (seconds): a local arithmetic task takes ~0.1 s, a real model's k=3
#: vote several seconds, a task that runs to its deadline a minute or more
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: tasks whose start time is remembered for the latency histogram (oldest forgotten first)
MAX_TRACKED_TASKS = 10_000

#: name (without the prefix and the ``_total`` suffix of counters) -> (type, labels, meaning)
METRICS: dict[str, tuple[str, str, str]] = {
    "info": ("gauge", "peer_id, network_id, version", "always 1; identifies the node"),
    "uptime_seconds": ("gauge", "", "seconds since the daemon started"),
    "peers_connected": ("gauge", "", "peers with an open libp2p connection"),
    "peers_known": ("gauge", "", "peers in the membership address book"),
    "peers_banned": ("gauge", "", "peers banned right now"),
    "messages_received": ("counter", "service, type, via",
                          "protocol messages received from peers, by owning service, message "
                          "type and channel (unicast or gossip)"),
    "messages_sent": ("counter", "service, type, via",
                      "protocol messages sent (unicast) or published (gossip)"),
    "driver_events": ("counter", "event",
                      "the driver's own counts: sends failed, publishes dropped, messages "
                      "refused as floods or replays, invalid messages"),
    "penalties": ("counter", "kind", "penalties counted against peers, by kind of fault"),
    "penalty_points": ("counter", "kind", "penalty points counted against peers"),
    "bans": ("counter", "kind", "peers banned, by the kind of the fault that banned them"),
    "tasks": ("counter", "outcome",
              "tasks this node asked that ended: done, partial (fewer than k results) or failed"),
    "task_latency_seconds": ("histogram", "outcome",
                             "from submitting a task to its end, as the requester saw it"),
    "tasks_computed": ("counter", "", "tasks this node's executor computed"),
    "tokens_generated": ("counter", "", "tokens this node's executor generated"),
    "compute_seconds": ("counter", "", "seconds this node's executor spent computing"),
    "verification_outcomes": ("counter", "decision",
                              "checks of executors' results this node requested, by decision "
                              "(passed, failed, undecided, abandoned)"),
    "verdicts_sent": ("counter", "status", "verdicts this node gave as a verifier"),
    "relay_bytes": ("counter", "direction", "weight-relay chunk bytes received (in) or served "
                    "(out); chunk rate: rate() of relay_chunks"),
    "relay_chunks": ("counter", "direction", "weight-relay chunks received (in) or served (out)"),
    "relay_bad_chunks": ("counter", "", "chunks received whose hash did not match"),
    "relay_transfers": ("gauge", "state", "artifact versions this node relays, by state"),
    "rl_policy_version": ("gauge", "", "the newest policy version a learner on this node "
                          "published (rl_jobs)"),
    "rl_step": ("gauge", "figure",
                "the figures of that version's learner step: mean_reward, heldout_accuracy, "
                "kl (to the base policy, per token), entropy (per token), clip_fraction, "
                "staleness (largest of its groups), rollout_tokens_per_s"),
    "ledger_records": ("gauge", "", "capability records held in the ledger"),
    "ledger_live_peers": ("gauge", "", "peers whose capability record has not expired"),
    "ledger_attestations": ("gauge", "", "attestations held in the ledger"),
}


def metric_names() -> list[str]:
    """Every exposed family name, prefix included (counters without ``_total``)."""
    return [f"{PREFIX}_{name}" for name in METRICS]


class NodeMetrics:
    """The metrics of one daemon: an observer for its driver and a ``/metrics`` route."""

    def __init__(self, driver: Any, info: dict[str, str]) -> None:
        self.driver = driver
        self.registry = CollectorRegistry(auto_describe=True)
        self._started_ms = driver.now_ms()
        self._task_started: OrderedDict[str, int] = OrderedDict()
        r, p = self.registry, PREFIX
        self.received = Counter(f"{p}_messages_received", METRICS["messages_received"][2],
                                ["service", "type", "via"], registry=r)
        self.sent = Counter(f"{p}_messages_sent", METRICS["messages_sent"][2],
                            ["service", "type", "via"], registry=r)
        self.penalties = Counter(f"{p}_penalties", METRICS["penalties"][2], ["kind"], registry=r)
        self.penalty_points = Counter(f"{p}_penalty_points", METRICS["penalty_points"][2],
                                      ["kind"], registry=r)
        self.bans = Counter(f"{p}_bans", METRICS["bans"][2], ["kind"], registry=r)
        self.tasks = Counter(f"{p}_tasks", METRICS["tasks"][2], ["outcome"], registry=r)
        self.latency = Histogram(f"{p}_task_latency_seconds",
                                 METRICS["task_latency_seconds"][2], ["outcome"],
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.computed = Counter(f"{p}_tasks_computed", METRICS["tasks_computed"][2], registry=r)
        self.tokens = Counter(f"{p}_tokens_generated", METRICS["tokens_generated"][2],
                              registry=r)
        self.compute_s = Counter(f"{p}_compute_seconds", METRICS["compute_seconds"][2],
                                 registry=r)
        self.checks = Counter(f"{p}_verification_outcomes",
                              METRICS["verification_outcomes"][2], ["decision"], registry=r)
        self.verdicts = Counter(f"{p}_verdicts_sent", METRICS["verdicts_sent"][2], ["status"],
                                registry=r)
        self.registry.register(_StateCollector(self, info))

    # ---- counted as it happens ------------------------------------------------------------

    def observe(self, service: str, item: object) -> None:
        """A driver observer (node/api/observed.py)."""
        if isinstance(item, Received):
            via = "unicast" if item.topic is None else "gossip"
            self.received.labels(service, type(item.message).__name__, via).inc()
        elif isinstance(item, Send):
            self.sent.labels(service, type(item.message).__name__, "unicast").inc()
        elif isinstance(item, Publish):
            self.sent.labels(service, type(item.message).__name__, "gossip").inc()
        elif isinstance(item, Emit):
            self._on_emit(item)
        elif isinstance(item, ComputeDone):
            self.computed.inc()
            self.tokens.inc(max(0, item.tokens))
            self.compute_s.inc(max(0, item.compute_ms) / 1000)
        elif isinstance(item, PenaltyNoted):
            self.penalties.labels(item.kind).inc()
            self.penalty_points.labels(item.kind).inc(max(0, item.points))
            if item.banned:
                self.bans.labels(item.kind).inc()

    def _on_emit(self, emit: Emit) -> None:
        fields = emit.fields
        if emit.event == "task.submitted":
            self._task_started[str(fields.get("task_id"))] = self.driver.now_ms()
            while len(self._task_started) > MAX_TRACKED_TASKS:
                self._task_started.popitem(last=False)
        elif emit.event in ("task.done", "task.failed"):
            outcome = ("failed" if emit.event == "task.failed"
                       else "partial" if fields.get("partial") else "done")
            self.tasks.labels(outcome).inc()
            started = self._task_started.pop(str(fields.get("task_id")), None)
            if started is not None:
                self.latency.labels(outcome).observe((self.driver.now_ms() - started) / 1000)
        elif emit.event == "verify.decided":
            self.checks.labels(str(fields.get("decision"))).inc()
        elif emit.event == "verify.verdict_sent":
            self.verdicts.labels(str(fields.get("status"))).inc()

    # ---- the route ------------------------------------------------------------------------

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def route(self) -> Route:
        async def metrics(request: Request) -> Response:
            return Response(self.exposition(), media_type=CONTENT_TYPE)

        return Route("/metrics", metrics, methods=["GET"])


class _StateCollector(Collector):
    """The values read when scraped, from the driver and the services' own counters."""

    def __init__(self, metrics: NodeMetrics, info: dict[str, str]) -> None:
        self.metrics = metrics
        self.info = info

    def collect(self) -> Iterator[Metric]:
        driver = self.metrics.driver
        now = driver.now_ms()
        yield _gauge("info", 1, labels=self.info)
        yield _gauge("uptime_seconds", (now - self.metrics._started_ms) / 1000)
        yield _gauge("peers_connected", len(driver.connected()))
        membership = driver.services.get("membership")
        known = membership.status().get("known_peers", 0) if membership is not None else 0
        yield _gauge("peers_known", known)
        yield _gauge("peers_banned", driver.penalties.banned_count(now))
        events = CounterMetricFamily(f"{PREFIX}_driver_events", METRICS["driver_events"][2],
                                     labels=["event"])
        for event, count in sorted(driver.counters.items()):
            events.add_metric([event], count)
        yield events
        yield from _relay(driver.services.get("relay"))
        yield from _rl_steps(driver.services.get("rl_jobs"))
        yield from _ledger(driver.services.get("ledger"), now)


def _gauge(name: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    labels = labels or {}
    family = GaugeMetricFamily(f"{PREFIX}_{name}", METRICS[name][2], labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, values: dict[str, float], label: str = "") -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", METRICS[name][2],
                                 labels=[label] if label else [])
    for key, value in values.items():
        family.add_metric([key] if label else [], value)
    return family


def _relay(relay: Any) -> Iterator[Metric]:
    if relay is None:
        return
    counters = relay.counters
    yield _counter("relay_bytes", {"in": counters.get("bytes_in", 0),
                                   "out": counters.get("bytes_out", 0)}, "direction")
    yield _counter("relay_chunks", {"in": counters.get("chunks_in", 0),
                                    "out": counters.get("chunks_out", 0)}, "direction")
    yield _counter("relay_bad_chunks", {"": counters.get("bad_chunks", 0)})
    states: dict[str, float] = {}
    for version in relay.status().get("versions", []):
        states[version["state"]] = states.get(version["state"], 0) + 1
    family = GaugeMetricFamily(f"{PREFIX}_relay_transfers", METRICS["relay_transfers"][2],
                               labels=["state"])
    for state, count in sorted(states.items()):
        family.add_metric([state], count)
    yield family


def _rl_steps(jobs: Any) -> Iterator[Metric]:
    """The newest learner step's figures, where this node's rl_jobs service has any."""
    rows = jobs.steps.rows() if jobs is not None else []
    if not rows:
        return
    newest = rows[-1]
    yield _gauge("rl_policy_version", newest["version"])
    family = GaugeMetricFamily(f"{PREFIX}_rl_step", METRICS["rl_step"][2], labels=["figure"])
    for key, value in sorted(newest.items()):
        if key != "version" and value is not None:
            family.add_metric([key], float(value))
    yield family


def _ledger(ledger: Any, now: int) -> Iterator[Metric]:
    if ledger is None:
        return
    status = ledger.machine.status(now)
    yield _gauge("ledger_records", status["records"])
    yield _gauge("ledger_live_peers", status["live_peers"])
    yield _gauge("ledger_attestations", status["attestations"])
