from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.hashing import digest, digest_parts
from crypto.merkle import (
    ProofStep,
    leaf_hash,
    merkle_proof,
    merkle_root,
    merkle_root_of_hashes,
    verify_proof,
)

leaves_st = st.lists(st.binary(max_size=40), min_size=1, max_size=70)


@settings(max_examples=150, deadline=None)
@given(leaves=leaves_st, data=st.data())
def test_every_leaf_proves_and_only_at_its_index(leaves: list[bytes], data: st.DataObject) -> None:
    root = merkle_root(leaves)
    assert merkle_root_of_hashes([leaf_hash(x) for x in leaves]) == root
    i = data.draw(st.integers(0, len(leaves) - 1))
    proof = merkle_proof(leaves, i)
    assert verify_proof(root, leaves[i], proof)
    assert verify_proof(root, leaves[i], proof, index=i, count=len(leaves))
    j = data.draw(st.integers(0, len(leaves) - 1))
    if leaves[j] != leaves[i]:
        assert not verify_proof(root, leaves[j], proof)
    if j != i:
        assert not verify_proof(root, leaves[i], proof, index=j, count=len(leaves))


@settings(max_examples=100, deadline=None)
@given(leaves=leaves_st, extra=st.binary(max_size=8), data=st.data())
def test_tampered_proofs_and_roots_fail(leaves: list[bytes], extra: bytes, data: st.DataObject) -> None:
    root = merkle_root(leaves)
    i = data.draw(st.integers(0, len(leaves) - 1))
    proof = merkle_proof(leaves, i)
    assert not verify_proof(root, leaves[i] + b"\x00" + extra, proof)
    if proof:
        k = data.draw(st.integers(0, len(proof) - 1))
        bad = list(proof)
        bad[k] = ProofStep(digest(bad[k].sibling), bad[k].sibling_is_left)
        assert not verify_proof(root, leaves[i], bad)
    assert merkle_root(leaves + [extra]) != root


def test_leaf_cannot_pose_as_inner_node() -> None:
    leaves = [b"a", b"b", b"c", b"d"]
    root = merkle_root(leaves)
    # a two-leaf tree whose leaves are the inner nodes must not share the root
    inner = [merkle_root(leaves[:2]), merkle_root(leaves[2:])]
    assert merkle_root(inner) != root
    # odd counts are not padded by duplication: [a, b, c] != [a, b, c, c]
    assert merkle_root([b"a", b"b", b"c"]) != merkle_root([b"a", b"b", b"c", b"c"])


def test_hash_choice_is_blake2b_256() -> None:
    import hashlib

    assert digest(b"abc") == hashlib.blake2b(b"abc", digest_size=32).digest()
    assert digest_parts([b"ab", b"c"]) != digest_parts([b"a", b"bc"])
