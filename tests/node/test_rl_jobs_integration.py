"""Rollout jobs across real daemons (loopback, port 0): a learner issues jobs through the
market, honest workers' groups come back accepted, a worker that holds another version never
gets one, a group convicted by a later check excludes its worker, and a cheating worker is
caught and excluded while its job is reissued."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from node.api.token import read_token

from .conftest import CONVERGE_S, Testnet
from .rl_generator import MODEL, VERSIONS_ENV

pytestmark = pytest.mark.integration

RUN = {"model": MODEL, "dataset_size": 100, "vocab_size": 1000, "group_size": 4,
       "prompts_per_job": 2, "max_tokens": 8, "staleness": 1, "job_ms": 30_000}


def _api(node: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    token = read_token(node.data_dir)
    return httpx.request(method, f"{node.api_url}/rl_jobs{path}", timeout=40,
                         headers={"Authorization": f"Bearer {token}"}, **kwargs)


def _take(learner: Any, want: int, deadline_s: float = 60.0) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    end = time.monotonic() + deadline_s
    while len(groups) < want and time.monotonic() < end:
        got = _api(learner, "GET", "/groups", params={"max": 64, "wait_s": 5})
        assert got.status_code == 200, got.text
        groups += got.json()["groups"]
    return groups


def test_rollout_jobs_through_the_market(testnet: Testnet) -> None:
    learner = testnet.start("learner", config={"rl_jobs": {"bid_window_ms": 1500}})
    honest = testnet.start("honest", bootstrap=[learner], wait=False,
                           config={"rl_worker": {"generator": "tests.node.rl_generator:honest"}})
    # the cheater holds only version 0: it serves another version than the run's first one
    cheater = testnet.start("cheater", bootstrap=[learner], wait=False, env={VERSIONS_ENV: "0"},
                            config={"rl_worker": {"generator": "tests.node.rl_generator:cheat"}})
    for node in (honest, cheater):
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    assert _api(learner, "POST", "/run", json={"bogus": 1}).status_code == 400
    assert _api(learner, "POST", "/run", json={**RUN, "version": 1}).status_code == 200
    # version 1: only the honest worker holds it; the other never bids
    _issue(learner, 2)
    groups = _take(learner, 2)
    assert len(groups) == 2
    assert all(g["version"] == 1 and len(g["completions"]) == 8 for g in groups)
    assert {g["worker"] for g in groups} == {honest.peer_id}
    worker = cheater.status()["services"]["rl_worker"]
    assert worker["counters"].get("bids_sent", 0) == 0
    assert worker["counters"]["beacon_skipped.other_version"] >= 1
    # a check the learner runs later (recomputation) fails for one group: its worker is out
    convicted = _api(learner, "POST", "/convict",
                     json={"job_id": groups[0]["job_id"], "reason": "mismatch KL 1.3"})
    assert convicted.status_code == 200 and convicted.json()["excluded"] == [honest.peer_id]
    assert _api(learner, "POST", "/convict", json={"job_id": "zz", "reason": "x"}
                ).status_code == 400
    # a new run at version 0 with the honest worker gone: the cheater wins a job, is caught
    honest.kill()
    assert _api(learner, "POST", "/run", json={**RUN, "version": 0}).status_code == 200
    _issue(learner, 1)
    testnet.wait_until(lambda: cheater.peer_id in _status(learner)["excluded"],
                       "the cheater caught", timeout_s=60)
    status = _status(learner)
    assert status["book"]["invalid"] == 1 and status["book"]["reissued"] >= 1
    assert honest.peer_id not in status["excluded"]


def _status(learner: Any) -> dict[str, Any]:
    return learner.status()["services"]["rl_jobs"]  # type: ignore[no-any-return]


def _issue(learner: Any, count: int) -> None:
    _api(learner, "POST", "/issue", json={"count": count})
