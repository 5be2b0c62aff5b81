"""The rollout services without a network: the learner's run, issue, version and group routes
(bad input named), the learner's step figures (the dashboard's reward curve), the bounded group
queue, and the worker service running a generator."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from crypto.keys import Identity
from node.api.dashboard_jobs import RunHistory, rl_view
from node.rl.rollout_jobs import RlJobsSection, RolloutJobsService
from node.rl.rollout_worker import RlWorkerSection, RolloutWorkerService
from node.rl.step_figures import MAX_STEPS
from protocol.rl.events import (
    GroupAccepted,
    IssueJobs,
    PublishVersion,
    RolloutDone,
    RolloutFailed,
    StartRollout,
)
from tests.node.rl_generator import MODEL
from tests.protocol.rl_fixtures import honest_result, make_job

TOKEN = "t0ken"


class _Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _ctx(section: object, submitted: list[object]) -> Any:
    async def submit(name: str, event: object) -> None:
        submitted.append(event)

    return SimpleNamespace(
        identity=Identity.generate(), network_id="t", data_dir=Path("."), db=None,
        transport=None, log=_Log(), rng=random.Random(3), clock=lambda: 0, submit=submit,
        services={}, config=SimpleNamespace(section=lambda name: section))


def _client(svc: RolloutJobsService) -> TestClient:
    app = Starlette(routes=[Mount("/rl_jobs", routes=svc.routes())])
    app.state.api_token = TOKEN
    return TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})


def test_run_issue_and_groups_routes() -> None:
    submitted: list[object] = []
    svc = RolloutJobsService(_ctx(RlJobsSection(max_groups=2), submitted))
    client = _client(svc)
    issue = client.post("/rl_jobs/issue", json={"count": 2})
    assert issue.status_code == 400 and "no run" in issue.json()["error"]
    bad = client.post("/rl_jobs/run", json={"dataset_size": "100"})
    assert bad.status_code == 400 and "dataset_size must be a int" in bad.json()["error"]
    unknown = client.post("/rl_jobs/run", json={"datasetsize": 100})
    assert unknown.status_code == 400 and "datasetsize" in unknown.json()["error"]
    huge = client.post("/rl_jobs/run", json={"dataset_size": 100, "group_size": 64,
                                             "max_tokens": 4096})
    assert huge.status_code == 400 and "tokens per result" in huge.json()["error"]
    ok = client.post("/rl_jobs/run", json={"dataset_size": 100, "model": MODEL, "staleness": 2,
                                           "version": 3})
    assert ok.status_code == 200 and ok.json()["version"] == 3 and ok.json()["staleness"] == 2
    assert client.post("/rl_jobs/issue", json={"count": 2}).json() == {"issued": 2}
    assert submitted == [IssueJobs(2, None)]
    assert client.post("/rl_jobs/issue", json={"count": 0}).status_code == 400
    assert client.post("/rl_jobs/version", json={"version": 2}).status_code == 400  # older
    assert client.get("/rl_jobs/groups", params={"wait_s": 99}).status_code == 400
    assert TestClient(client.app).post("/rl_jobs/issue", json={"count": 1}).status_code == 401


@pytest.mark.parametrize(("body", "field"), [
    ({"version": 3, "mean_reward": "0.5"}, "mean_reward"),
    ({"version": 3, "mean_reward": True}, "mean_reward"),  # a bool is not a number
    ({"version": 3, "mean_reward": 2e6}, "mean_reward"),  # past MAX_ABS_REWARD
    ({"version": 3, "mean_reward": 0.5, "heldout_accuracy": 1.5}, "heldout_accuracy"),
    ({"version": 3, "mean_reward": 0.5, "heldout_accuracy": -0.1}, "heldout_accuracy"),
    ({"version": 3, "mean_reward": 0.5, "heldout_accuracy": [1]}, "heldout_accuracy"),
    ({"version": 3, "heldout_accuracy": 0.5}, "heldout_accuracy needs"),  # no reward beside it
    ({"version": "3", "mean_reward": 0.5}, "version"),
    ({"version": 3, "mean_reward": 0.5, "clip_fraction": 1.5}, "clip_fraction"),
    ({"version": 3, "mean_reward": 0.5, "kl": -0.1}, "kl"),
    ({"version": 3, "mean_reward": 0.5, "entropy": "1"}, "entropy"),
    ({"version": 3, "mean_reward": 0.5, "rollout_tokens_per_s": False}, "rollout_tokens_per_s"),
])
def test_a_version_with_bad_step_figures_is_refused_naming_the_field(
        body: dict[str, Any], field: str) -> None:
    submitted: list[object] = []
    svc = RolloutJobsService(_ctx(RlJobsSection(), submitted))
    answer = _client(svc).post("/rl_jobs/version", json=body)
    assert answer.status_code == 400 and field in answer.json()["error"], answer.text
    assert submitted == [] and svc.status()["steps"] == []  # nothing published, nothing kept


@pytest.mark.parametrize("raw", [b'{"version": 3, "mean_reward": NaN}',
                                 b'{"version": 3, "mean_reward": 0.5, "heldout_accuracy": Infinity}'])
def test_json_nan_and_infinity_are_not_step_figures(raw: bytes) -> None:
    svc = RolloutJobsService(_ctx(RlJobsSection(), []))
    answer = _client(svc).post("/rl_jobs/version", content=raw,
                               headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and "finite" in answer.json()["error"]


def test_published_steps_are_the_status_steps_and_the_dashboard_curve() -> None:
    submitted: list[object] = []
    svc = RolloutJobsService(_ctx(RlJobsSection(), submitted))
    client = _client(svc)
    assert client.post("/rl_jobs/version", json={"version": 1, "mean_reward": 0}).status_code == 200
    assert client.post("/rl_jobs/version", json={"version": 2, "mean_reward": 0.25,
                                                 "heldout_accuracy": 0.4}).status_code == 200
    # the same version again replaces its figures; a version without figures adds no step
    assert client.post("/rl_jobs/version", json={"version": 2, "mean_reward": 0.5,
                                                 "heldout_accuracy": 1}).status_code == 200
    assert client.post("/rl_jobs/version", json={"version": 3}).status_code == 200
    telemetry = {"kl": 0.01, "entropy": 2.5, "clip_fraction": 0.0, "staleness": 1,
                 "rollout_tokens_per_s": 12.5}
    assert client.post("/rl_jobs/version", json={"version": 4, "mean_reward": 0.75,
                                                 **telemetry}).status_code == 200
    assert svc.status()["steps"][-1] == {"version": 4, "mean_reward": 0.75,
                                         "heldout_accuracy": None, **telemetry}
    svc.steps.forget_after(3)
    assert submitted[-1] == PublishVersion(4)
    submitted.pop()
    assert submitted == [PublishVersion(1), PublishVersion(2), PublishVersion(2),
                         PublishVersion(3)]
    steps = [{"version": 1, "mean_reward": 0.0, "heldout_accuracy": None},
             {"version": 2, "mean_reward": 0.5, "heldout_accuracy": 1.0}]
    assert svc.status()["steps"] == steps
    view = rl_view({"rl_jobs": svc}, RunHistory())
    assert view is not None and view["steps"] == steps
    # a new run from version 1 forgets the steps of the run it abandons past that version
    assert client.post("/rl_jobs/run", json={"dataset_size": 10, "version": 1}).status_code == 200
    assert [s["version"] for s in svc.status()["steps"]] == [1]
    for version in range(2, MAX_STEPS + 10):
        svc.steps.record(version, -1.5)
    kept = svc.status()["steps"]
    assert len(kept) == MAX_STEPS and kept[-1] == {"version": MAX_STEPS + 9, "mean_reward": -1.5,
                                                   "heldout_accuracy": None}


def test_the_bandit_selector_is_a_setting() -> None:
    from protocol.market.linucb import LinUCBSelector
    from protocol.market.selection import ExploringSelector

    svc = RolloutJobsService(_ctx(RlJobsSection(selector="linucb", dataset_size=10,
                                                explore_share=0.2), []))
    selector = svc.machine.selector
    assert isinstance(selector, ExploringSelector) and selector.share == 0.2
    assert isinstance(selector.inner, LinUCBSelector)
    with pytest.raises(ValueError, match="selector"):
        RlJobsSection(selector="random")
    with pytest.raises(ValueError, match="explore_share"):
        RlJobsSection(explore_share=1.5)


def test_accepted_groups_wait_in_a_bounded_queue() -> None:
    svc = RolloutJobsService(_ctx(RlJobsSection(max_groups=2), []))
    job = make_job()
    bodies = [honest_result(job, attempt=i) for i in range(3)]

    async def main() -> list[Any]:
        for body in bodies:
            await svc.perform(GroupAccepted(body))
        return await svc.take_groups(10, 0.0)

    assert [g.attempt for g in trio.run(main)] == [1, 2]  # the oldest dropped
    assert svc.dropped == 1 and svc.status()["dropped_groups"] == 1
    groups = _client(svc).get("/rl_jobs/groups", params={"max": 5}).json()["groups"]
    assert groups == []


@pytest.mark.parametrize("which", ["honest", "cheat"])
def test_worker_service_runs_its_generator(which: str) -> None:
    submitted: list[object] = []
    section = RlWorkerSection(generator=f"tests.node.rl_generator:{which}")
    svc = RolloutWorkerService(_ctx(section, submitted))
    job = make_job(model=MODEL, policy_version=1)

    async def main() -> None:
        await svc.start()
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await svc.perform(StartRollout(job, 4, 10_000))
            while not submitted:
                await trio.sleep(0)  # the generator's thread hands its result back
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert svc.status()["enabled"] and svc.machine.config.model == MODEL
    [done] = submitted
    assert isinstance(done, RolloutDone) and done.attempt == 4
    assert len(done.result.completions) == job.prompts * job.group_size


def test_worker_service_without_a_generator_refuses_jobs() -> None:
    submitted: list[object] = []
    svc = RolloutWorkerService(_ctx(RlWorkerSection(), submitted))

    async def main() -> None:
        await svc.start()
        await svc.perform(StartRollout(make_job(), 0, 10_000))

    trio.run(main)
    [failed] = submitted
    assert isinstance(failed, RolloutFailed) and "no generator" in failed.reason
    assert not svc.status()["enabled"]
    with pytest.raises(ValueError, match="generator"):
        RlWorkerSection(generator="nonsense")


@pytest.mark.integration
def test_builtin_generator_answers_a_job_that_passes_validation() -> None:
    """The real path: the embedded model through models/rl/rollout.py, version 0."""
    from node.rl.rollout_worker import models_generator
    from protocol.rl.messages import RolloutSampling
    from protocol.rl.validation import check_group

    generator = models_generator(RlWorkerSection(generator="models", threads=1), Path("."))
    assert generator.tokens_per_s > 0 and 0 in generator.versions()
    job = make_job(model=generator.model, policy_version=0, prompts=1, group_size=2,
                   dataset_size=generator.env.size,  # type: ignore[attr-defined]
                   sampling=RolloutSampling(temperature=1.0, top_p=1.0, max_tokens=8))
    result = generator.generate_group(job, worker="me", attempt=3)
    assert result.attempt == 3 and len(result.completions) == 2
    assert check_group(job, result, vocab_size=49_152) is None


def test_a_restarted_learner_daemon_resumes_its_run(tmp_path: Path) -> None:
    """The run, its version, the workers caught and its open jobs survive a restart of the
    daemon (the same SQLite file); a version older than the saved one is refused after it."""
    from node.db import Database
    from node.rl import rollout_state
    from protocol.market.events import Attest
    from protocol.rl.events import Convict

    def service(db: Database, submitted: list[object]) -> tuple[RolloutJobsService, TestClient]:
        ctx = _ctx(RlJobsSection(), submitted)
        ctx.db = db
        db.apply_schema(RolloutJobsService.schema)
        svc = RolloutJobsService(ctx)

        async def submit(name: str, event: object) -> None:  # the driver: handle, perform
            submitted.append(event)
            for effect in svc.machine.handle(event, 0):
                if isinstance(effect, GroupAccepted | Attest):  # the others: the driver's
                    await svc.perform(effect)
        ctx.submit = submit
        return svc, _client(svc)

    db = Database(tmp_path / "node.db")
    first, client = service(db, [])
    ok = client.post("/rl_jobs/run", json={"dataset_size": 50, "model": MODEL, "staleness": 1,
                                           "group_size": 4})
    assert ok.status_code == 200
    assert client.post("/rl_jobs/issue", json={"count": 3}).status_code == 200
    assert client.post("/rl_jobs/version", json={"version": 4}).status_code == 200
    assert client.post("/rl_jobs/issue", json={"count": 2}).status_code == 200
    job = make_job()
    book = first.machine.book
    book.judged[job.job_id] = (job, "cheater")
    trio.run(first.ctx.submit, "rl_jobs", Convict(job.job_id, "log-probs disagree"))
    first.save()
    assert first.status()["excluded"] == ["cheater"]
    db.conn.close()

    submitted: list[object] = []
    again, client = service(Database(tmp_path / "node.db"), submitted)
    trio.run(again.start)
    status = again.status()
    assert (status["version"], status["staleness"], status["excluded"]) == (4, 1, ["cheater"])
    assert again.run_section.dataset_size == 50 and again.run_section.group_size == 4
    # version 0's 3 jobs are past S = 1; version 4's 2, and the convicted job's reissue, go out
    trio.run(again.on_running)
    assert submitted == [IssueJobs(3, 4)]
    assert again.status()["in_flight"] == 3
    assert client.post("/rl_jobs/version", json={"version": 3}).status_code == 400
    assert not again.machine.book.eligible("cheater")
    state = rollout_state.load(again.ctx.db)
    assert state is not None and state["open"] == {"4": 3}


def test_an_unreadable_saved_run_starts_a_new_one(tmp_path: Path) -> None:
    from node.db import Database
    from node.rl import rollout_state

    db = Database(tmp_path / "node.db")
    db.apply_schema(RolloutJobsService.schema)
    db.execute("INSERT INTO rl_jobs_state(id, state) VALUES(1, ?)", ('{"run": 3}',))
    with pytest.raises(ValueError, match="lacks run"):
        rollout_state.load(db)
    ctx = _ctx(RlJobsSection(), [])
    ctx.db = db
    svc = RolloutJobsService(ctx)
    trio.run(svc.start)
    assert svc.status()["version"] == 0


def test_a_steps_telemetry_is_what_the_daemon_accepts() -> None:
    from node.rl.learner_trainer import StepStats
    from node.rl.step_figures import step_telemetry, telemetry

    stats = StepStats(version=3, mean_reward=0.5, groups=2, skipped=0, tokens=10, masked=1,
                      loss=0.0, kl=0.25, step_s=1.0, entropy=1.5, clip_fraction=0.1,
                      group_staleness=(0, 2), rollout_tokens_per_s=20.0)
    measured = step_telemetry(stats)
    assert measured == {"kl": 0.25, "entropy": 1.5, "clip_fraction": 0.1, "staleness": 2.0,
                        "rollout_tokens_per_s": 20.0}
    assert telemetry(measured) == measured
