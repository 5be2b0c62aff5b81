"""Malformed, forged, late, early, inconsistent, replayed and copied commitments and reveals,
and requests that try to make a verifier convict someone, each driven through full flows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from crypto.envelope import Envelope
from protocol.codec import Message
from protocol.envelopes import open_envelope, seal
from protocol.machine import Received
from protocol.market.events import AuctionConfig
from protocol.market.messages import RESULT_DOMAIN, Cancel, Result, ResultBody
from protocol.verification.messages import (
    CHECK_DOMAIN,
    COMMIT_DOMAIN,
    VERDICT_DOMAIN,
    CheckBody,
    CheckRequest,
    Commit,
    CommitBody,
    Reveal,
    RevealRequest,
    Verdict,
    VerdictBody,
    VerdictStatus,
)
from protocol.verification.requester import VerifyConfig
from protocol.verification.rules import pack_ids
from tests.protocol.verify_net import MODEL_HASH, VerifyNet, ident

HONEST3 = ["honest", "honest", "honest"]
FRAME = 1 << 20


def worker_identity(net: VerifyNet, peer: str) -> Any:
    return net.workers[peer].machine.identity


def statuses(snap: dict[str, Any]) -> dict[str, str]:
    return {peer: s["status"] for peer, s in snap["verification"].items()}


def resign_commit(net: VerifyNet, peer: str, msg: Commit, **changes: object) -> Commit:
    body = open_envelope(msg.envelope, COMMIT_DOMAIN, CommitBody, FRAME)
    body = dataclasses.replace(body, **changes)  # type: ignore[arg-type]
    return Commit(envelope=seal(worker_identity(net, peer), COMMIT_DOMAIN, body))


def test_plain_result_without_commitment_is_refused() -> None:
    net = VerifyNet(["ok"], HONEST3)
    victim = next(iter(net.workers))

    def tap(src: str, dst: str, m: Message) -> Message | None:
        if isinstance(m, Commit):  # deliver the result as the bare market would, skipping commit
            sealed = net.workers[src].machine._sealed
            return Result(envelope=next(iter(sealed.values())).result)
        return m

    net.tap = tap
    snap = net.run_task(deadline_ms=10_000)
    assert net.auction.counters["results_rejected.uncommitted"] == 1
    assert snap["phase"] == "failed" and victim not in snap["verification"]


@pytest.mark.parametrize("fault,counter,penalized", [
    ("bad_signature", "commits_rejected.invalid", True),
    ("forged_sender", "commits_rejected.forged", True),
])
def test_malformed_or_forged_commit_is_penalized(fault: str, counter: str,
                                                 penalized: bool) -> None:
    net = VerifyNet(["ok", "ok"], HONEST3)
    bad = list(net.workers)[0]
    other = list(net.workers)[1]

    def tap(src: str, dst: str, m: Message) -> Message | None:
        if isinstance(m, Commit) and src == bad:
            if fault == "bad_signature":
                env = m.envelope
                return Commit(envelope=Envelope(public_key=env.public_key, domain=env.domain,
                                                payload=env.payload,
                                                signature=bytes(64)))
            net.inject(other, dst, m)  # the other executor relays bad's commitment
            return None
        return m

    net.tap = tap
    snap = net.run_task(k=2)
    assert net.auction.counters[counter] == 1
    assert any(p.peer in (bad, other) for _, p in net.penalties) == penalized
    assert bad not in {r["executor"] for r in snap["results"]}


@pytest.mark.parametrize("change,why", [
    ({"nonce_hash": b"\x00" * 32}, "names another nonce"),
    ({"spec_hash": b"\x00" * 32}, "is for another task"),
    ({"model_hash": b"\x00" * 32}, "names another model than the bid"),
])
def test_inconsistent_commit_fails_the_attempt(change: dict[str, object], why: str) -> None:
    net = VerifyNet(["ok", "ok"], HONEST3)
    bad = list(net.workers)[0]
    net.tap = lambda s, d, m: resign_commit(net, s, m, **change) \
        if isinstance(m, Commit) and s == bad else m
    snap = net.run_task(k=2)
    assert net.auction.counters["commits_rejected.inconsistent"] == 1
    attempts = {a["peer"]: a for a in snap["attempts"]}
    assert attempts[bad]["state"] == "failed" and why in attempts[bad]["reason"]
    assert any(a.subject == bad and a.outcome == "failed" for a in net.attests)
    assert bad not in {r["executor"] for r in snap["results"]}


def test_commit_without_fingerprints_is_refused_when_required() -> None:
    net = VerifyNet(["ok", "ok"], HONEST3)
    bad = list(net.workers)[0]
    net.tap = lambda s, d, m: resign_commit(net, s, m, chunks=0, fingerprint_root=b"") \
        if isinstance(m, Commit) and s == bad else m
    snap = net.run_task(k=2)
    attempts = {a["peer"]: a for a in snap["attempts"]}
    assert "has no fingerprints" in attempts[bad]["reason"]


def test_slow_executor_misses_the_window_and_its_late_commit_is_refused() -> None:
    net = VerifyNet(["ok", "ok", "ok"], HONEST3,
                    verify=VerifyConfig(sample_rate=1.0, commit_window_ms=1_000))
    slow = list(net.workers)[2]
    net.workers[slow].compute_ms = 5_000
    # the slow executor never hears its attempt was dropped, so it commits anyway, late
    net.tap = lambda s, d, m: None if isinstance(m, Cancel) and d == slow else m
    snap = net.run_task()
    attempts = {a["peer"]: a for a in snap["attempts"]}
    assert attempts[slow]["reason"] == "missed the commit window"
    assert net.auction.counters["commits_rejected.late"] == 1
    assert slow not in {r["executor"] for r in snap["results"]}
    assert snap["answer"] == "42" and len(snap["results"]) == 2


def test_early_and_duplicate_reveals_are_dropped() -> None:
    net = VerifyNet(["ok", "ok"], HONEST3,
                    verify=VerifyConfig(sample_rate=1.0, commit_window_ms=2_000),
                    config=AuctionConfig(close_grace_ms=1_500))
    net.workers[list(net.workers)[1]].compute_ms = 1_500  # keeps the window open a while
    first = list(net.workers)[0]
    tid = net.submit(k=2)
    net.step_to(net.now + 1_700)  # first has committed, the window is still open
    sealed = next(iter(net.workers[first].machine._sealed.values()))
    early = Reveal(task_id=tid, attempt=sealed.body.attempt, result=sealed.result,
                   salt=sealed.salt, output_ids=sealed.output_ids)
    net.inject(first, net.rq, early)
    net.step_to(net.now + 30_000)
    assert net.auction.counters["reveals_rejected.early"] == 1
    net.inject(first, net.rq, early)  # after the fact: a duplicate (the task is done)
    net.step_to(net.now + 10)
    snap = net.last(tid)
    assert set(statuses(snap).values()) == {"passed"}
    assert net.auction.counters["reveals_rejected.duplicate"] == 1


def tamper_reveal(net: VerifyNet, peer: str, how: str, stash: dict[str, Reveal]) -> None:
    def tap(src: str, dst: str, m: Message) -> Message | None:
        if not isinstance(m, Reveal) or src != peer:
            if isinstance(m, Reveal):
                stash.setdefault(src, m)
            return m
        if how == "salt":
            return dataclasses.replace(m, salt=b"\x00" * 32)
        if how == "output":
            return dataclasses.replace(m, output_ids=pack_ids([7] * (len(m.output_ids) // 4)))
        if how == "answer":
            body = open_envelope(m.result, RESULT_DOMAIN, ResultBody, FRAME)
            body = dataclasses.replace(body, answer="41")
            return dataclasses.replace(m, result=seal(worker_identity(net, peer), RESULT_DOMAIN,
                                                      body))
        if how == "replay":
            return dataclasses.replace(m, result=stash["replay"].result,
                                       salt=stash["replay"].salt,
                                       output_ids=stash["replay"].output_ids)
        if how == "copy":  # re-sign the other executor's revealed result as its own
            other = next(r for s, r in stash.items() if s not in (peer, "replay"))
            body = open_envelope(other.result, RESULT_DOMAIN, ResultBody, FRAME)
            body = dataclasses.replace(body, executor=peer, attempt=m.attempt)
            return dataclasses.replace(m, result=seal(worker_identity(net, peer), RESULT_DOMAIN,
                                                      body), salt=other.salt)
        if how == "someone_elses":
            other = next(r for s, r in stash.items() if s not in (peer, "replay"))
            return dataclasses.replace(m, result=other.result)
        raise AssertionError(how)

    net.tap = tap


@pytest.mark.parametrize("how,why", [
    ("salt", "answer, CoT, tokens or salt differ"),
    ("output", "answer, CoT, tokens or salt differ"),
    ("answer", "answer, CoT, tokens or salt differ"),
    ("replay", "result is for another task or attempt"),
    ("copy", "answer, CoT, tokens or salt differ"),
    ("someone_elses", "result is someone else's"),
])
def test_reveal_not_matching_its_commitment_is_a_failed_attested_result(how: str,
                                                                        why: str) -> None:
    net = VerifyNet(["ok", "ok", "ok"], HONEST3)
    bad = list(net.workers)[2]
    stash: dict[str, Reveal] = {}
    if how == "replay":  # a reveal of bad's own from an earlier task
        net.tap = lambda s, d, m: stash.setdefault("replay", m) and m \
            if isinstance(m, Reveal) and s == bad else m
        net.run_task()
        assert "replay" in stash
    if how in ("copy", "someone_elses"):  # the copier is slower: others reveal first
        net.workers[bad].compute_ms = 150
        net.verify = VerifyConfig(sample_rate=1.0)
    tamper_reveal(net, bad, how, stash)
    if how in ("copy", "someone_elses"):
        # reveals leave together at the window close; hold bad's back until the others arrived
        inner = net.tap
        held: list[tuple[str, str, Message]] = []

        def tap(src: str, dst: str, m: Message) -> Message | None:
            if isinstance(m, Reveal) and src == bad and len(stash) < 2:
                held.append((src, dst, m))
                return None
            if isinstance(m, Reveal) and src != bad:
                out = inner(src, dst, m)
                for s, d, hm in held:
                    net.deliver(s, d, hm)
                held.clear()
                return out
            return inner(src, dst, m)

        net.tap = tap
    snap = net.run_task()
    assert statuses(snap)[bad] == "failed", snap["verification"]
    assert why in snap["verification"][bad]["detail"]
    failed = net.verdicts_about(bad, "VERIFICATION_FAILED")
    assert [o for o, _ in failed] == [net.rq] and len(failed[0][1].evidence_hash) == 32
    assert bad not in {r["executor"] for r in snap["results"]}
    assert net.auction.is_excluded(bad, net.now)


@pytest.mark.parametrize("k", [1, 2])
def test_a_k1_executor_reveals_behind_its_commitment_unasked(k: int) -> None:
    """k=1: no RevealRequest round trip before the answer (rules.reveals_with_commit); the
    result is still opened against the commitment and checked (sample rate 1)."""
    net = VerifyNet(["ok"] * k, HONEST3)
    snap = net.run_task()
    assert snap["phase"] == "done" and set(statuses(snap).values()) == {"passed"}
    kinds = [type(m) for _, _, m in net.sent]
    assert kinds.count(RevealRequest) == (0 if k == 1 else k)
    assert kinds.count(Reveal) == k
    for w in net.workers:  # each reveal went out right behind its own commitment (k=1)
        mine = [type(m) for src, _, m in net.sent if src == w and type(m) in (Commit, Reveal)]
        assert mine == [Commit, Reveal]


def test_executor_refuses_a_reveal_request_with_the_wrong_nonce() -> None:
    net = VerifyNet(["ok", "ok"], HONEST3)  # k=2: a k=1 executor reveals unasked
    net.tap = lambda s, d, m: dataclasses.replace(m, nonce=b"\x00" * 32) \
        if isinstance(m, RevealRequest) else m
    snap = net.run_task(deadline_ms=10_000)
    for w in net.workers.values():
        assert w.machine.counters["reveal_requests_bad_nonce"] == 1
    assert any(p.peer == net.rq for _, p in net.penalties)
    assert snap["phase"] == "failed"


def test_executor_ignores_reveal_requests_from_others() -> None:
    net = VerifyNet(["ok"], HONEST3)
    w = next(iter(net.workers))
    snap = net.run_task()
    sealed = next(iter(net.workers[w].machine._sealed.values()))
    net.perform(w, net.workers[w].machine.handle(
        Received("intruder", RevealRequest(task_id=sealed.body.task_id, attempt=0,
                                           nonce=b"\x00" * 32)), net.now))
    assert net.workers[w].machine.counters["reveal_requests_ignored"] == 1
    assert snap["phase"] == "done"


def test_forged_unsolicited_and_inconsistent_verdicts_are_rejected() -> None:
    net = VerifyNet(["other_model"], HONEST3, verify=VerifyConfig(sample_rate=1.0, verifiers=1))
    cheater = net.peer_of("other_model")
    v = list(net.checkers)
    outsider = ident(999)

    def tap(src: str, dst: str, m: Message) -> Message | None:
        if isinstance(m, Verdict) and src in net.checkers:
            body = open_envelope(m.envelope, VERDICT_DOMAIN, VerdictBody, FRAME)
            passing = dataclasses.replace(body, status=VerdictStatus.PASS)
            # an outsider's PASS verdict, a PASS from a verifier nobody asked, and a PASS
            # from the real verifier naming other evidence: none may rescue the cheater
            net.inject(outsider.peer_id, dst, Verdict(envelope=seal(
                outsider, VERDICT_DOMAIN, dataclasses.replace(passing,
                                                              verifier=outsider.peer_id))))
            for other in v:
                if other != src:
                    net.inject(other, dst, Verdict(envelope=seal(
                        net.checkers[other].machine.identity, VERDICT_DOMAIN,
                        dataclasses.replace(passing, verifier=other))))
            net.inject(src, dst, Verdict(envelope=seal(
                net.checkers[src].machine.identity, VERDICT_DOMAIN,
                dataclasses.replace(passing, evidence_hash=b"\x00" * 32))))
            return None
        return m

    net.tap = tap
    net.run_task()
    c = net.auction.counters
    assert c["verdicts_rejected.unsolicited"] >= 3 and c["verdicts_rejected.inconsistent"] >= 1
    assert "checks_passed" not in c and cheater not in {
        r["executor"] for u in net.updates for r in u.snapshot.data["results"]}  # type: ignore[attr-defined]


@pytest.mark.parametrize("tamper,problem", [
    ("chunks", "chunks are not the ones the seed chooses"),
    ("fingerprint", "is not in the committed root"),
    ("output", "output does not open the commitment"),
    ("question", "task differs from the one the executor committed to"),
    ("nonce", "nonce does not match"),
    ("batch", "commitment is not in the window it claims"),
])
def test_verifier_refuses_a_request_that_would_frame_the_executor(tamper: str,
                                                                  problem: str) -> None:
    """A requester that alters what the executor committed to gets DECLINED, never FAIL."""
    net = VerifyNet(["ok"], ["honest"], verify=VerifyConfig(sample_rate=1.0, verifiers=1))
    w = next(iter(net.workers))

    def tap(src: str, dst: str, m: Message) -> Message | None:
        if not isinstance(m, CheckRequest):
            return m
        body = open_envelope(m.envelope, CHECK_DOMAIN, CheckBody, FRAME)
        if tamper == "chunks":
            idx = tuple(i for i in range(4) if i not in body.chunk_indices)[:2]
            body = dataclasses.replace(body, chunk_indices=idx)
        elif tamper == "fingerprint":
            body = dataclasses.replace(body, fingerprints=(b"\x00" * 24,) + body.fingerprints[1:])
        elif tamper == "output":
            body = dataclasses.replace(body, output_ids=pack_ids([5] * (len(body.output_ids) // 4)))
        elif tamper == "question":
            body = dataclasses.replace(body, task=dataclasses.replace(body.task, question="7*6?"))
        elif tamper == "nonce":
            body = dataclasses.replace(body, nonce=b"\x00" * 32)
        elif tamper == "batch":
            body = dataclasses.replace(body, batch=(b"\x00" * 32,))
        return CheckRequest(envelope=seal(net.requester, CHECK_DOMAIN, body))

    net.tap = tap
    snap = net.run_task()
    checker = next(iter(net.checkers.values()))
    assert not checker.checks  # nothing was computed
    assert any(p.peer == net.rq and problem in p.reason for _, p in net.penalties)
    assert not net.verdicts_about(w, "VERIFICATION_FAILED")
    assert statuses(snap)[w] == "undecided"


def test_verifier_penalizes_malformed_and_forged_requests() -> None:
    net = VerifyNet(["ok"], ["honest"], verify=VerifyConfig(sample_rate=1.0, verifiers=1))
    v = next(iter(net.checkers))
    reqs: list[CheckRequest] = []
    net.tap = lambda s, d, m: reqs.append(m) or m if isinstance(m, CheckRequest) else m
    net.run_task()
    (req,) = reqs
    machine = net.checkers[v].machine
    env = req.envelope
    garbled = CheckRequest(envelope=Envelope(public_key=env.public_key, domain=env.domain,
                                             payload=env.payload[:-3], signature=env.signature))
    eff = machine.handle(Received(net.rq, garbled), net.now)
    assert machine.counters["checks_rejected.invalid"] == 1 and eff
    eff = machine.handle(Received(list(net.workers)[0], req), net.now)  # relayed by another
    assert machine.counters["checks_rejected.forged"] == 1 and eff
    eff = machine.handle(Received(net.rq, req), net.now)  # a repeat: the same verdict again
    assert machine.counters["checks_duplicate"] == 1
    assert len(eff) == 1 and isinstance(eff[0].message, Verdict)  # type: ignore[attr-defined]


def test_verifier_without_the_model_declines_and_is_not_penalized() -> None:
    net = VerifyNet(["ok"], ["blind", "honest"], verify=VerifyConfig(sample_rate=1.0,
                                                                     verifiers=1))
    snap = net.run_task()
    assert statuses(snap)[next(iter(net.workers))] == "passed"
    assert not net.penalties
    assert MODEL_HASH not in next(c for c in net.checkers.values()
                                  if c.behaviour == "blind").machine.config.model_hashes
