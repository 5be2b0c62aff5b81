"""A binary Merkle tree over byte-string leaves, with inclusion proofs.

Leaf and inner-node hashes are domain-separated (BLAKE2b personalisation) so a leaf can never
pose as an inner node (the second-preimage attack on naive Merkle trees). An odd node at the
end of a level is promoted unchanged to the next level (no duplication, which would let two
different leaf lists share a root, as in CVE-2012-2459).

A proof is the list of sibling hashes from leaf to root, each with a flag saying whether the
sibling sits on the left. Given the leaf index and the leaf count, ``verify_proof`` also checks
that the flags are exactly the path of that index, so a proof for leaf 3 cannot pass as leaf 5.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from crypto.hashing import HASH_LEN, digest

_LEAF = b"symphony-leaf"
_NODE = b"symphony-node"
MAX_PROOF_DEPTH = 64


def leaf_hash(data: bytes) -> bytes:
    return digest(data, person=_LEAF)


def leaf_hash_of_parts(parts: Iterable[bytes | memoryview]) -> bytes:
    """``leaf_hash`` of the parts' concatenation, hashed in place (no joined copy of a large
    leaf; hashlib releases the GIL while it hashes a big part)."""
    h = hashlib.blake2b(digest_size=HASH_LEN, person=_LEAF)
    for part in parts:
        h.update(part)
    return h.digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return digest(left + right, person=_NODE)


@dataclass(frozen=True, slots=True)
class ProofStep:
    sibling: bytes
    sibling_is_left: bool


def _levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    return _levels_of_hashes([leaf_hash(x) for x in leaves])


def _levels_of_hashes(leaf_hashes: Sequence[bytes]) -> list[list[bytes]]:
    if not leaf_hashes:
        raise ValueError("a Merkle tree needs at least one leaf")
    level = list(leaf_hashes)
    levels = [level]
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
        levels.append(level)
    return levels


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    return _levels(leaves)[-1][0]


def merkle_root_of_hashes(leaf_hashes: Sequence[bytes]) -> bytes:
    """Root when the leaves are already ``leaf_hash``-ed (e.g. chunk hashes in a manifest)."""
    return _levels_of_hashes(leaf_hashes)[-1][0]


def merkle_proof(leaves: Sequence[bytes], index: int) -> list[ProofStep]:
    return merkle_proof_of_hashes([leaf_hash(x) for x in leaves], index)


def merkle_proof_of_hashes(leaf_hashes: Sequence[bytes], index: int) -> list[ProofStep]:
    """The proof for leaf ``index`` when only the leaves' hashes are at hand."""
    if not 0 <= index < len(leaf_hashes):
        raise IndexError(f"leaf index {index} out of range for {len(leaf_hashes)} leaves")
    proof: list[ProofStep] = []
    for level in _levels_of_hashes(leaf_hashes)[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(ProofStep(level[sibling], sibling_is_left=sibling < index))
        index //= 2
    return proof


def _path_flags(index: int, count: int) -> list[bool]:
    """The ``sibling_is_left`` flags of the proof for leaf ``index`` of ``count``."""
    flags: list[bool] = []
    while count > 1:
        if index ^ 1 < count:
            flags.append(bool(index & 1))
        index //= 2
        count = (count + 1) // 2
    return flags


def verify_proof(
    root: bytes,
    leaf: bytes,
    proof: Sequence[ProofStep],
    *,
    index: int | None = None,
    count: int | None = None,
) -> bool:
    """True iff ``leaf`` is in the tree of ``root`` (at ``index`` of ``count``, if given)."""
    if len(proof) > MAX_PROOF_DEPTH:
        return False
    if index is not None and count is not None:
        if not 0 <= index < count:
            return False
        if [s.sibling_is_left for s in proof] != _path_flags(index, count):
            return False
    h = leaf_hash(leaf)
    for step in proof:
        h = node_hash(step.sibling, h) if step.sibling_is_left else node_hash(h, step.sibling)
    return h == root
