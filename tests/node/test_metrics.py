"""GET /metrics: Prometheus text that the official parser reads, one registry per daemon, and
counters that move when a task runs (real daemons, loopback, the arithmetic test solver)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.api.metrics import METRICS, NodeMetrics, metric_names
from node.api.observed import PenaltyNoted
from node.api.token import read_token
from protocol.machine import Emit, Received, Send
from protocol.market.events import ComputeDone
from protocol.membership.messages import Ping

from .conftest import ARITH_SOLVER, CONVERGE_S, TASKS, Testnet


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


class _Clock:
    now = 1_000


class _RelayDouble:
    """What NodeMetrics reads of the relay service: its counters and its transfers."""

    counters = {"bytes_in": 4096, "chunks_in": 4, "bytes_out": 1024, "chunks_out": 1,
                "bad_chunks": 0}

    def status(self) -> dict[str, Any]:
        return {"versions": [{"state": "complete"}, {"state": "fetching"},
                             {"state": "fetching"}]}


class _DriverDouble:
    """What NodeMetrics reads of a driver: clock, peers, penalties, counters, services."""

    services: dict[str, Any] = {"relay": _RelayDouble()}
    counters = {"sent": 3, "invalid": 1}

    def now_ms(self) -> int:
        return _Clock.now

    def connected(self) -> dict[str, Any]:
        return {"peer-a": object(), "peer-b": object()}

    class penalties:  # noqa: N801 (mirrors Driver.penalties)
        @staticmethod
        def status(now: int) -> dict[str, Any]:
            return {"penalties": {}, "banned": {"peer-x": 12.0}}

        @staticmethod
        def banned_count(now: int) -> int:
            return 1


def test_observed_events_become_parseable_metrics() -> None:
    metrics = NodeMetrics(_DriverDouble(), {"peer_id": "p", "network_id": "n", "version": "v"})
    metrics.observe("membership", Received("peer-a", Ping(nonce=1)))
    metrics.observe("membership", Send("peer-a", Ping(nonce=2)))
    metrics.observe("tasks", Emit("task.submitted", {"task_id": "aa", "k": 1}))
    _Clock.now += 1_500
    metrics.observe("tasks", Emit("task.done", {"task_id": "aa", "partial": False}))
    metrics.observe("tasks", Emit("task.failed", {"task_id": "bb", "why": "x"}))
    metrics.observe("verify", Emit("verify.decided", {"task_id": "aa", "decision": "passed"}))
    metrics.observe("driver", PenaltyNoted("peer-x", "flood", 5, banned=True))
    metrics.observe("executor", ComputeDone(task_id=b"\x01" * 16, attempt=0, answer="42",
                                            cot="cot", confidence=0.9, tokens=17,
                                            compute_ms=250, model_hash=b"\x00" * 32))
    found = samples(metrics.exposition().decode())
    assert value(found, "symphony_messages_received_total", service="membership", type="Ping",
                 via="unicast") == 1
    assert value(found, "symphony_messages_sent_total", service="membership", type="Ping",
                 via="unicast") == 1
    assert value(found, "symphony_tasks_total", outcome="done") == 1
    assert value(found, "symphony_tasks_total", outcome="failed") == 1
    assert value(found, "symphony_task_latency_seconds_count", outcome="done") == 1
    assert value(found, "symphony_task_latency_seconds_sum", outcome="done") == 1.5
    # a task whose start this node never saw (restored after a restart) has no latency
    assert value(found, "symphony_task_latency_seconds_count", outcome="failed") == 0
    assert value(found, "symphony_verification_outcomes_total", decision="passed") == 1
    assert value(found, "symphony_penalties_total", kind="flood") == 1
    assert value(found, "symphony_bans_total", kind="flood") == 1
    assert value(found, "symphony_tokens_generated_total") == 17
    assert value(found, "symphony_compute_seconds_total") == 0.25
    assert value(found, "symphony_peers_connected") == 2
    assert value(found, "symphony_peers_banned") == 1
    assert value(found, "symphony_driver_events_total", event="sent") == 3
    assert value(found, "symphony_relay_bytes_total", direction="in") == 4096
    assert value(found, "symphony_relay_chunks_total", direction="out") == 1
    assert value(found, "symphony_relay_transfers", state="fetching") == 2
    # documented: every family exposed here is in METRICS, with the symphony_ prefix
    # (prometheus_client adds a ``<name>_created`` timestamp beside each counter/histogram)
    names = {f.name for f in text_string_to_metric_families(metrics.exposition().decode())
             if not f.name.endswith("_created")}
    assert names <= set(metric_names())
    assert all(name.startswith("symphony_") for name in names)


def test_each_daemon_has_its_own_registry() -> None:
    one = NodeMetrics(_DriverDouble(), {"peer_id": "1", "network_id": "n", "version": "v"})
    two = NodeMetrics(_DriverDouble(), {"peer_id": "2", "network_id": "n", "version": "v"})
    one.observe("tasks", Emit("task.failed", {"task_id": "cc"}))
    assert value(samples(one.exposition().decode()), "symphony_tasks_total",
                 outcome="failed") == 1
    assert value(samples(two.exposition().decode()), "symphony_tasks_total",
                 outcome="failed") == 0
    assert len(METRICS) == len(set(METRICS))


@pytest.mark.integration
def test_counters_move_when_a_task_runs(testnet: Testnet) -> None:
    asker = testnet.start("asker", config={"tasks": TASKS})
    executor = testnet.start("e1", bootstrap=[asker],
                             config={"executor": {"solver": ARITH_SOLVER}})
    testnet.wait_all_connected(CONVERGE_S)

    def scrape(node: Any) -> dict[Any, float]:
        reply = httpx.get(f"{node.api_url}/metrics", timeout=10)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(
            "text/plain"), reply.text
        return samples(reply.text)

    before, exec_before = scrape(asker), scrape(executor)
    assert value(before, "symphony_peers_connected") == 1
    assert value(before, "symphony_tasks_total", outcome="done") == 0
    token = read_token(asker.data_dir)
    made = httpx.post(f"{asker.api_url}/tasks/", timeout=60,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"question": "What is 6 * 7?", "answer_type": "number", "k": 1,
                            "deadline_ms": 40000})
    assert made.status_code == 200 and made.json()["answer"] == "42", made.text
    after, exec_after = scrape(asker), scrape(executor)
    assert value(after, "symphony_tasks_total", outcome="done") == 1
    assert value(after, "symphony_task_latency_seconds_count", outcome="done") == 1
    assert value(after, "symphony_messages_received_total", service="tasks", type="Bid",
                 via="unicast") >= 1
    assert value(after, "symphony_messages_sent_total", service="tasks", type="Beacon",
                 via="gossip") >= 1
    assert value(exec_after, "symphony_tasks_computed_total") == value(
        exec_before, "symphony_tasks_computed_total") + 1
    assert value(exec_after, "symphony_tokens_generated_total") > value(
        exec_before, "symphony_tokens_generated_total")
    assert value(after, "symphony_ledger_records") >= 2
    assert value(after, "symphony_info", peer_id=asker.peer_id, network_id="itest",
                 version=after_version(after)) == 1
    # the executor's Bid, Commit and Reveal went on streams it had open already
    assert executor.status()["request_streams"]["reused"] >= 3


def after_version(found: dict[Any, float]) -> str:
    (labels,) = [dict(k[1]) for k in found if k[0] == "symphony_info"]
    return labels["version"]


def test_the_newest_learner_steps_figures_are_gauges() -> None:
    from types import SimpleNamespace

    from node.rl.step_figures import StepFigures

    steps = StepFigures()
    driver = _DriverDouble()
    driver.services = {"rl_jobs": SimpleNamespace(steps=steps)}
    metrics = NodeMetrics(driver, {"peer_id": "p", "network_id": "n", "version": "v"})
    assert "symphony_rl_step" not in metrics.exposition().decode()  # no step yet, no family
    steps.record(4, 0.25, None, {"kl": 0.01, "entropy": 1.5})
    steps.record(5, 0.5, 0.3, {"kl": 0.02, "entropy": 1.25, "clip_fraction": 0.125,
                                "staleness": 2.0, "rollout_tokens_per_s": 40.0})
    found = samples(metrics.exposition().decode())
    assert value(found, "symphony_rl_policy_version") == 5
    expected = {"mean_reward": 0.5, "heldout_accuracy": 0.3, "kl": 0.02, "entropy": 1.25,
                "clip_fraction": 0.125, "staleness": 2.0, "rollout_tokens_per_s": 40.0}
    for figure, number in expected.items():
        assert value(found, "symphony_rl_step", figure=figure) == number
