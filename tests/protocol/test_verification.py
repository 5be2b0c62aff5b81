"""Commit/reveal and sampled verification through full market flows: every adversary the
scheme must withstand is a test here (executors that cheat, verifiers that lie, frame or idle,
no verifier at all), plus the detection and exclusion rates."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from protocol.envelopes import open_envelope, seal
from protocol.verification.messages import CHECK_DOMAIN, CheckBody, CheckRequest, VerdictStatus
from protocol.verification.requester import VerifyConfig
from protocol.verification.rules import (
    choose_chunks,
    rank_verifiers,
    sampled,
    selection_seed,
)
from tests.protocol.verify_net import (
    ADAPTER,
    AGENT_CALLS,
    AGENT_PROMPT,
    OTHER_ADAPTER,
    VerifyNet,
)

HONEST3 = ["honest", "honest", "honest"]
CHEATS = ["other_model", "tamper", "fabricated_cot"]


def statuses(snap: dict[str, Any]) -> dict[str, str]:
    return {peer: s["status"] for peer, s in snap["verification"].items()}


def voters(snap: dict[str, Any]) -> set[str]:
    return {v for row in snap["votes"] for v in row["voters"]}


@pytest.mark.parametrize("seed", range(30))
def test_honest_executors_never_fail(seed: int) -> None:
    net = VerifyNet(["ok", "ok", "ok"], HONEST3 + ["honest"], seed=seed)
    snap = net.run_task()
    assert snap["phase"] == "done" and snap["answer"] == "42", f"seed {seed}"
    assert set(statuses(snap).values()) == {"passed"}, f"seed {seed}"
    assert voters(snap) == set(net.workers)
    kinds = {a.kind.name for _, a in net.ledger}
    assert kinds == {"VERIFICATION_PASSED"}, f"seed {seed}: {kinds}"
    assert not net.penalties and not net.auction.exclusions


@pytest.mark.parametrize("cheat", CHEATS)
def test_cheating_executor_is_caught_removed_attested_and_excluded(cheat: str) -> None:
    net = VerifyNet(["ok", "ok", cheat], HONEST3)
    cheater = net.peer_of(cheat)
    snap = net.run_task()
    assert statuses(snap)[cheater] == "failed"
    assert cheater not in voters(snap) and snap["answer"] == "42"
    assert all(r["executor"] != cheater for r in snap["results"])
    # the requester's verdict and each verifier's own, with the same evidence hash
    failed = net.verdicts_about(cheater, "VERIFICATION_FAILED")
    observers = {o for o, _ in failed}
    assert net.rq in observers and len(observers) >= 2
    assert len({a.evidence_hash for _, a in failed}) == 1
    assert not net.verdicts_about(cheater, "VERIFICATION_PASSED")
    # excluded: the next task goes to the honest peers only
    started = len(net.workers[cheater].started)
    snap2 = net.run_task(k=2)
    assert len(net.workers[cheater].started) == started
    assert set(statuses(snap2).values()) == {"passed"}
    assert net.auction.counters["bids_excluded"] >= 1


def test_partial_tamper_is_caught_when_its_chunk_is_sampled() -> None:
    """Only the last chunk is altered: caught iff a check samples it (here 2 of 4 chunks)."""
    caught = 0
    runs = 60
    for seed in range(runs):
        net = VerifyNet(["tamper_last"], HONEST3, seed=seed)
        snap = net.run_task()
        s = snap["verification"][net.peer_of("tamper_last")]
        assert (s["status"] == "failed") == (3 in s.get("chunks", [3])), f"seed {seed}"
        caught += s["status"] == "failed"
    assert 0.3 <= caught / runs <= 0.7  # expected 2/4


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_detection_rate_matches_sampling_rate(p: float) -> None:
    runs, caught = 150, 0
    net = VerifyNet(["other_model"], HONEST3, verify=VerifyConfig(sample_rate=p, exclusion_ms=0))
    cheater = net.peer_of("other_model")
    for _ in range(runs):
        snap = net.run_task()
        s = snap["verification"][cheater]["status"]
        assert s in ("failed", "not_sampled")
        caught += s == "failed"
    sigma = (p * (1 - p) / runs) ** 0.5
    assert abs(caught / runs - p) <= 3.5 * sigma, caught / runs


def test_cheater_is_excluded_after_a_bounded_number_of_tasks() -> None:
    net = VerifyNet(["ok", "ok", "other_model"], HONEST3, verify=VerifyConfig(sample_rate=0.2))
    cheater = net.peer_of("other_model")
    tasks_until_caught = None
    for i in range(60):
        net.run_task(k=3)
        if net.auction.is_excluded(cheater, net.now):
            tasks_until_caught = i + 1
            break
    assert tasks_until_caught is not None and tasks_until_caught <= 30
    started = len(net.workers[cheater].started)
    for _ in range(10):
        net.run_task(k=2)
    assert len(net.workers[cheater].started) == started


def test_honest_executors_lose_no_reputation_to_verification_over_many_tasks() -> None:
    net = VerifyNet(["ok", "ok", "ok"], HONEST3, verify=VerifyConfig(sample_rate=0.5))
    for _ in range(40):
        snap = net.run_task()
        assert snap["answer"] == "42" and "failed" not in statuses(snap).values()
    bad = {a.kind.name for _, a in net.ledger} - {"VERIFICATION_PASSED"}
    assert not bad and not net.auction.exclusions


def test_lazy_verifier_is_contradicted_and_the_cheater_still_fails() -> None:
    net = VerifyNet(["other_model"], ["lazy", "honest", "honest", "honest", "honest"],
                    verify=VerifyConfig(sample_rate=1.0, verifiers=2, panel=3, exclusion_ms=0))
    lazy = next(p for p, c in net.checkers.items() if c.behaviour == "lazy")
    asked = 0
    for _ in range(12):
        snap = net.run_task()
        s = snap["verification"][net.peer_of("other_model")]
        asked += lazy in s["verifiers"]
        assert s["status"] == "failed"  # the honest majority of every panel decides
    contradicted = net.verdicts_about(lazy, "VERDICT_CONTRADICTED")
    assert asked >= 2 and len(contradicted) == asked
    honest = [p for p, c in net.checkers.items() if c.behaviour == "honest"]
    assert all(not net.verdicts_about(h, "VERDICT_CONTRADICTED") for h in honest)


def test_one_honest_verifier_keeps_a_cheater_out_even_when_no_panel_can_be_formed() -> None:
    net = VerifyNet(["ok", "ok", "other_model"], ["lazy", "honest"],
                    verify=VerifyConfig(sample_rate=1.0, verifiers=2))
    snap = net.run_task()
    cheater = net.peer_of("other_model")
    assert statuses(snap)[cheater] == "undecided"
    assert cheater not in voters(snap) and snap["answer"] == "42"
    # the honest verifier's failing verdict is on record regardless
    assert any(o != net.rq for o, _ in net.verdicts_about(cheater, "VERIFICATION_FAILED"))


def test_a_framing_verifier_cannot_convict_an_honest_executor() -> None:
    net = VerifyNet(["ok", "ok", "ok"], ["framer", "honest", "honest", "honest", "honest"],
                    verify=VerifyConfig(sample_rate=1.0))
    framer = next(p for p, c in net.checkers.items() if c.behaviour == "framer")
    for _ in range(5):
        snap = net.run_task()
        assert set(statuses(snap).values()) == {"passed"}
        assert voters(snap) == set(net.workers)
    assert len(net.verdicts_about(framer, "VERDICT_CONTRADICTED")) >= 1
    assert not net.auction.exclusions
    assert not [a for o, a in net.ledger if o == net.rq and a.kind.name == "VERIFICATION_FAILED"]


@pytest.mark.parametrize("other", ["silent", "blind"])
def test_unresponsive_or_unable_verifier_is_replaced(other: str) -> None:
    net = VerifyNet(["ok", "other_model"], [other, other, "honest", "honest"],
                    verify=VerifyConfig(sample_rate=1.0, check_timeout_ms=3_000))
    snap = net.run_task()
    assert statuses(snap)[net.peer_of("other_model")] == "failed"
    assert statuses(snap)[net.peer_of("ok")] == "passed"
    word = "timeout" if other == "silent" else "declined"
    seen = [w for s in snap["verification"].values() for w in s["verifiers"].values()]
    assert word in seen


def test_no_verifier_available_admits_unchecked_and_says_so() -> None:
    net = VerifyNet(["ok", "other_model"], [])
    snap = net.run_task()
    assert set(statuses(snap).values()) == {"no_verifier"}
    assert len(snap["results"]) == 2
    assert all(r["verification"] == "no_verifier" for r in snap["results"])


def test_sample_rate_zero_checks_nothing() -> None:
    net = VerifyNet(["ok", "other_model"], HONEST3, verify=VerifyConfig(sample_rate=0.0))
    snap = net.run_task()
    assert set(statuses(snap).values()) == {"not_sampled"}
    assert not any(c.checks for c in net.checkers.values())


def test_any_node_recomputes_the_choices_from_the_check_data() -> None:
    net = VerifyNet(["ok", "ok", "ok"], HONEST3 + ["honest", "honest"])
    snap = net.run_task()
    requests = [m for s, d, m in net.sent if isinstance(m, CheckRequest)]
    assert len(requests) == 6  # three results, two verifiers each, nobody declined
    for req in requests:
        body = open_envelope(req.envelope, CHECK_DOMAIN, CheckBody, 1 << 20)
        commit_exec = [p for p in net.workers if p in snap["verification"]]
        seed = selection_seed(body.task.task_id, body.nonce, body.batch)
        executor = next(p for p in commit_exec
                        if snap["verification"][p]["attempt"] == decode_attempt(body))
        assert sampled(seed, executor, 1.0)
        assert body.chunk_indices == choose_chunks(seed, executor, 4, 2)
        ranking = rank_verifiers(seed, net.checkers, exclude=(executor, net.rq))
        assert body.verifier in ranking[:2]


def decode_attempt(body: CheckBody) -> int:
    from protocol.verification.messages import COMMIT_DOMAIN, CommitBody

    return open_envelope(body.commit, COMMIT_DOMAIN, CommitBody, 1 << 20).attempt


def test_verdict_statuses_cover_the_enum() -> None:
    assert {s.value for s in VerdictStatus} == {"pass", "fail", "declined"}


def test_an_agents_result_is_checked_with_the_prompt_and_tool_calls_it_read() -> None:
    """An agent's result carries its system prompt and tool calls; the check request hands
    them to the verifier, which re-computes over them (and passes), and a requester that
    alters them in the check is refused: they are bound to the executor's commitment."""
    net = VerifyNet(["agent", "ok"], ["honest", "honest"])
    snap = net.run_task()
    assert snap["phase"] == "done" and set(statuses(snap).values()) == {"passed"}, snap
    agent = net.peer_of("agent")
    (row,) = [r for r in snap["results"] if r["executor"] == agent]
    assert row["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "6*7"},
                                  "output": "42"}]
    checks = [c for checker in net.checkers.values() for c in checker.checks
              if c.executor == agent]
    assert checks and all(c.tool_calls == AGENT_CALLS and c.system_prompt == AGENT_PROMPT
                          for c in checks)

    def alter(src: str, dest: str, msg: object) -> object:
        if isinstance(msg, CheckRequest):
            body = open_envelope(msg.envelope, CHECK_DOMAIN, CheckBody, 1 << 20)
            if body.tool_calls:
                forged = dataclasses.replace(body, tool_calls=(dataclasses.replace(
                    body.tool_calls[0], output="41"),))
                return CheckRequest(envelope=seal(net.requester, CHECK_DOMAIN, forged))
        return msg

    net.tap = alter  # type: ignore[assignment]
    snap = net.run_task()
    assert statuses(snap)[agent] != "failed", snap  # never convicted of what it did not commit
    assert any("does not open the commitment" in p.reason for _, p in net.penalties)


def test_an_adapter_agents_result_is_checked_on_its_adapter_and_a_liar_is_caught() -> None:
    """A result on a LoRA adapter names the adapter's hash; the check request hands it to the
    verifier, which re-computes on it and passes the honest one; an executor that names one
    adapter and ran another fails its check; a requester that alters the adapter in the
    check is refused: it is bound to the executor's commitment."""
    net = VerifyNet(["adapter", "ok"], ["honest", "honest"])
    snap = net.run_task()
    assert snap["phase"] == "done" and set(statuses(snap).values()) == {"passed"}, snap
    agent = net.peer_of("adapter")
    checks = [c for checker in net.checkers.values() for c in checker.checks
              if c.executor == agent]
    assert checks and all(c.adapter == ADAPTER for c in checks)

    liar = VerifyNet(["adapter_liar", "ok"], ["honest", "honest"])
    assert statuses(liar.run_task())[liar.peer_of("adapter_liar")] == "failed"

    def alter(src: str, dest: str, msg: object) -> object:
        if isinstance(msg, CheckRequest):
            body = open_envelope(msg.envelope, CHECK_DOMAIN, CheckBody, 1 << 20)
            if body.adapter:
                forged = dataclasses.replace(body, adapter=OTHER_ADAPTER)
                return CheckRequest(envelope=seal(net.requester, CHECK_DOMAIN, forged))
        return msg

    net.tap = alter  # type: ignore[assignment]
    snap = net.run_task()
    assert statuses(snap)[agent] != "failed", snap  # never convicted of what it did not commit
    assert any("does not open the commitment" in p.reason for _, p in net.penalties)
