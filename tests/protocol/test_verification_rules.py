"""Pure verification rules and message limits: commitments, seed, draws, ranking, escalation."""

from __future__ import annotations

import pytest

from crypto.envelope import Envelope
from crypto.hashing import digest
from crypto.keys import Identity
from crypto.merkle import merkle_proof, merkle_root, verify_proof
from protocol.agents.wire import ToolCallRecord
from protocol.codec import decode, encode, registered
from protocol.errors import InvalidMessage
from protocol.ledger.records import AttestationKind
from protocol.ledger.view import LedgerView
from protocol.verification.messages import (
    COMMIT_DOMAIN,
    CommitBody,
    Reveal,
)
from protocol.verification.rules import (
    Decision,
    agent_context,
    choose_chunks,
    choose_layers,
    decide,
    decode_proof,
    encode_proof,
    ledger_convicted,
    pack_ids,
    rank_verifiers,
    result_commitment,
    sampled,
    selection_seed,
    unpack_ids,
)

TID = b"\x07" * 32


def test_tags_stay_in_the_verification_range() -> None:
    ours = {t: c for t, c in registered().items() if c.__module__ == "protocol.verification.messages"}
    assert sorted(ours) == list(range(70, 82))


def test_ids_pack_round_trip_and_refuse_non_u32() -> None:
    ids = [0, 1, 49151, 2**32 - 1]
    assert unpack_ids(pack_ids(ids)) == tuple(ids)
    for bad in (-1, 2**32):
        with pytest.raises(ValueError):
            pack_ids([bad])
    with pytest.raises(ValueError):
        unpack_ids(b"\x00" * 5)


BASE = dict(task_id=TID, attempt=0, executor="a", answer="42", cot="cot",
            output_ids=pack_ids([1, 2]), salt=b"\x01" * 32)


@pytest.mark.parametrize("field,other", [
    ("task_id", b"\x08" * 32), ("attempt", 1), ("executor", "b"), ("answer", "43"),
    ("cot", "cot."), ("output_ids", pack_ids([1, 3])), ("salt", b"\x02" * 32),
    ("context", agent_context("You add.", ())),
])
def test_commitment_binds_every_part(field: str, other: object) -> None:
    changed = {**BASE, field: other}
    assert result_commitment(**changed) != result_commitment(**BASE)  # type: ignore[arg-type]


def test_an_agents_context_binds_its_prompt_and_every_tool_call() -> None:
    call = ToolCallRecord(name="calculator", arguments='{"expression":"2*3"}', output="6")
    assert agent_context("", ()) == b""  # a result as before agents commits as it did
    assert result_commitment(**BASE, context=b"") == result_commitment(**BASE)  # type: ignore[arg-type]
    contexts = {agent_context(p, c) for p, c in [
        ("", (call,)), ("You add.", (call,)), ("You add.", ()),
        ("", (ToolCallRecord(name="calculator", arguments='{"expression":"2*3"}', output="7"),)),
        ("", (call, call))]}
    assert len(contexts) == 5


def test_an_adapter_is_bound_and_bounded() -> None:
    """The adapter's hash is part of the agent context (none: as before), and a hash that is
    not 32 bytes is refused on the wire, in a result as in a check request."""
    from protocol.codec import decode, encode
    from protocol.errors import InvalidMessage
    from protocol.market.messages import ResultBody

    assert agent_context("", (), b"") == b""
    bound = {agent_context("", (), b"\x01" * 32), agent_context("", (), b"\x02" * 32),
             agent_context("You add.", (), b"\x01" * 32), agent_context("You add.", ())}
    assert len(bound) == 4
    body = ResultBody(task_id=TID, attempt=0, executor="a", answer="42", cot="c",
                      confidence=0.5, tokens=1, compute_ms=1, model_hash=b"", fingerprints=(),
                      fingerprint_root=b"", adapter=b"\x01" * 32)
    assert decode(encode(body)) == body
    for bad in (b"\x01" * 5, b"\x01" * 33):
        with pytest.raises(InvalidMessage):
            decode(encode(ResultBody(**{**{f: getattr(body, f) for f in body.__slots__},  # type: ignore[arg-type]
                                        "adapter": bad})))


def test_seed_ignores_commit_order_but_not_nonce_or_commits() -> None:
    hs = [digest(bytes([i])) for i in range(4)]
    s = selection_seed(TID, b"n" * 32, hs)
    assert s == selection_seed(TID, b"n" * 32, list(reversed(hs)))
    assert s != selection_seed(TID, b"m" * 32, hs)
    assert s != selection_seed(TID, b"n" * 32, hs[:3])


@pytest.mark.parametrize("p", [0.0, 0.1, 0.2, 0.5, 1.0])
def test_sampling_rate_matches_p(p: float) -> None:
    n = 4000
    hits = sum(sampled(digest(i.to_bytes(4, "big")), "exec", p) for i in range(n))
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(hits / n - p) <= 4 * sigma + 1e-9


def test_chunks_distinct_ascending_in_range() -> None:
    for i in range(200):
        seed = digest(i.to_bytes(4, "big"))
        count, n = 1 + i % 9, 1 + i % 4
        c = choose_chunks(seed, "e", count, n)
        assert list(c) == sorted(set(c)) and len(c) == min(n, count)
        assert all(0 <= x < count for x in c)
    # every chunk is chosen about equally often (no steering towards, say, the first)
    counts = [0] * 4
    for i in range(2000):
        for x in choose_chunks(digest(i.to_bytes(4, "big")), "e", 4, 1):
            counts[x] += 1
    assert min(counts) > 400


def test_layers_distinct_ascending_and_never_layer_one() -> None:
    counts = [0] * 31
    for i in range(3000):
        seed = digest(i.to_bytes(4, "big"))
        la = choose_layers(seed, "e", 30, 2)
        assert list(la) == sorted(set(la)) and len(la) == 2 and all(2 <= x <= 30 for x in la)
        for x in la:
            counts[x] += 1
    assert min(counts[2:]) > 120  # each of 29 layers drawn ~207 times: no favourite
    assert choose_layers(digest(b"s"), "e", 1, 2) == ()  # one layer: layer 1 is always run
    assert choose_layers(digest(b"s"), "e", 2, 5) == (2,)
    assert choose_layers(digest(b"s"), "e", 30, 2) != choose_layers(digest(b"s"), "f", 30, 2)


def test_ranking_excludes_and_ignores_candidate_order() -> None:
    seed = digest(b"s")
    cands = [f"v{i}" for i in range(8)]
    r = rank_verifiers(seed, cands, exclude=("v3", "rq"))
    assert "v3" not in r and sorted(r) == sorted(set(cands) - {"v3"})
    assert r == rank_verifiers(seed, list(reversed(cands)) + ["v1"], exclude=("v3",))
    assert r != rank_verifiers(digest(b"t"), cands, exclude=("v3",))


@pytest.mark.parametrize("rounds,max_esc,expected", [
    ([{"a": True, "b": True}], 2, Decision.PASS),
    ([{"a": False, "b": False}], 2, Decision.FAIL),
    ([{"a": True, "b": False}], 2, Decision.ESCALATE),
    ([{"a": True, "b": False}], 0, Decision.UNDECIDED),
    ([{"a": True, "b": False}, {"c": False, "d": False, "e": False}], 2, Decision.FAIL),
    ([{"a": True, "b": False}, {"c": True, "d": True}], 2, Decision.PASS),
    ([{"a": True, "b": False}, {"c": True, "d": False}], 2, Decision.ESCALATE),
    ([{"a": True, "b": False}, {"c": True, "d": False}], 1, Decision.UNDECIDED),
    ([{"a": True, "b": False}, {}], 2, Decision.UNDECIDED),
    ([], 2, Decision.UNDECIDED),
])
def test_escalation_rule(rounds: list[dict[str, bool]], max_esc: int,
                         expected: Decision) -> None:
    assert decide(rounds, max_esc) is expected


def test_proofs_round_trip_with_index_binding() -> None:
    leaves = [bytes([i]) * 20 for i in range(5)]
    root = merkle_root(leaves)
    for i in range(5):
        steps = decode_proof(encode_proof(merkle_proof(leaves, i)))
        assert verify_proof(root, leaves[i], steps, index=i, count=5)
        assert not verify_proof(root, leaves[i], steps, index=(i + 1) % 5, count=5)
    for bad in (b"\x00" * 32, b"\x02" + b"\x00" * 32):
        with pytest.raises(ValueError):
            decode_proof(bad)


def commit_body(**kw: object) -> CommitBody:
    fields: dict[str, object] = dict(
        task_id=TID, attempt=0, executor="e", spec_hash=b"\x01" * 32, nonce_hash=b"\x02" * 32,
        commitment=b"\x03" * 32, fingerprint_root=b"\x04" * 32, chunks=4, chunk_tokens=32,
        tokens=103, model_hash=b"\x05" * 32)
    fields.update(kw)
    return CommitBody(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [
    {"chunks": 5},  # 103 tokens make 3 or 4 chunks of 32
    {"chunks": 2},
    {"chunks": 0},  # a root without chunks
    {"fingerprint_root": b""},  # chunks without a root
    {"fingerprint_root": b"\x04" * 31},
    {"states_root": b"\x06" * 32},  # a states root without a layer count
    {"state_layers": 30},  # a layer count without a root
    {"states_root": b"\x06" * 31, "state_layers": 30},
])
def test_inconsistent_commit_does_not_decode(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        decode(encode(commit_body(**kw)), CommitBody)


def test_consistent_commits_decode() -> None:
    for kw in ({}, {"chunks": 3}, {"chunks": 0, "fingerprint_root": b"", "tokens": 0},
               {"states_root": b"\x06" * 32, "state_layers": 30}):
        body = commit_body(**kw)
        assert decode(encode(body), CommitBody) == body


def test_reveal_refuses_partial_token_ids() -> None:
    env = Envelope.sign(Identity.from_seed(b"\x01" * 32), COMMIT_DOMAIN, b"x")
    ok = Reveal(task_id=TID, attempt=0, result=env, salt=b"\x00" * 32, output_ids=b"\x00" * 8)
    assert decode(encode(ok), Reveal) == ok
    bad = Reveal(task_id=TID, attempt=0, result=env, salt=b"\x00" * 32, output_ids=b"\x00" * 7)
    with pytest.raises(InvalidMessage):
        decode(encode(bad), Reveal)


def _ledger_with(*specs: tuple[int, int, AttestationKind, int]) -> LedgerView:
    """(observer, subject, kind, observed_at) identity indices -> a view holding them."""
    from protocol.codec import decode as _decode
    from protocol.ledger.records import Attestation
    from protocol.ledger.state import LedgerState
    from tests.protocol.ledger_net import HOUR, attestation, identity

    state = LedgerState()
    for n, (obs, subj, kind, at) in enumerate(specs):
        env = attestation(identity(obs), identity(subj).peer_id, kind=kind, now=at,
                          ttl=30 * 24 * HOUR, object_id=bytes([n]) * 4)
        state.merge_attestation(env, _decode(env.payload, Attestation), identity(obs).peer_id,
                                env.content_hash)
    return LedgerView(state, "me")


def test_ledger_conviction_needs_two_reputable_observers() -> None:
    from tests.protocol.ledger_net import T0, identity

    K = AttestationKind
    cheat = identity(9).peer_id
    vouched = [(5, 3, K.TASK_COMPLETED, T0), (5, 4, K.TASK_COMPLETED, T0)]  # 5 vouches for 3, 4
    failed_by = [(3, 9, K.VERIFICATION_FAILED, T0), (4, 9, K.VERIFICATION_FAILED, T0)]
    window = 60 * 60_000
    assert ledger_convicted(_ledger_with(*vouched, *failed_by), cheat, T0, window)
    # one observer alone, however reputable, cannot exclude anyone network-wide
    assert not ledger_convicted(_ledger_with(*vouched, failed_by[0]), cheat, T0, window)
    # fresh identities nobody vouches for cannot either
    assert not ledger_convicted(_ledger_with(*failed_by), cheat, T0, window)
    # and old failures have served their time
    assert not ledger_convicted(_ledger_with(*vouched, *failed_by), cheat, T0 + 2 * window,
                                window)
