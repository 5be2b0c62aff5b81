"""LedgerState indexes attestations by subject lazily (when the index is read or an attestation
leaves). Whatever the order of merges, evictions, prunes and reads, ``by_subject`` and
``subject_version`` must equal what indexing each change at once gives, numbering included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.envelope import Envelope
from protocol.codec import decode
from protocol.ledger.records import Attestation, Rejected
from protocol.ledger.state import LedgerState
from tests.protocol.ledger_net import HOUR, MINUTE, T0, attestation, identity

OBSERVERS = [identity(40 + i) for i in range(3)]
SUBJECTS = [identity(50 + i).peer_id for i in range(3)]
QUOTA = 2


def _pool() -> list[tuple[Envelope, Attestation, str]]:
    items = []
    for i, obs in enumerate(OBSERVERS):
        for j, subject in enumerate(SUBJECTS):
            for k in range(2):  # two per pair and minute: the observer quota evicts
                env = attestation(
                    obs,
                    subject,
                    object_id=bytes([i, j, k]),
                    now=T0 + k * MINUTE,
                    ttl=(j + 1) * HOUR,
                )
                items.append((env, decode(env.payload, Attestation), obs.peer_id))
    return items


POOL = _pool()


class Eager:
    """The index kept at once, as the merge rules define it."""

    def __init__(self) -> None:
        self.by_subject: dict[str, set[bytes]] = {}
        self.version: dict[str, int] = {}
        self.changes = 0

    def add(self, subject: str, h: bytes) -> None:
        self.by_subject.setdefault(subject, set()).add(h)
        self.changes += 1
        self.version[subject] = self.changes

    def remove(self, subject: str, h: bytes) -> None:
        self.by_subject[subject].discard(h)
        self.changes += 1
        self.version[subject] = self.changes
        if not self.by_subject[subject]:
            del self.by_subject[subject]
            del self.version[subject]


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("merge"), st.integers(0, len(POOL) - 1)),
            st.tuples(st.just("read"), st.just(0)),
            st.tuples(st.just("prune"), st.integers(0, 4)),
        ),
        max_size=60,
    )
)
def test_lazy_subject_index_equals_eager_indexing(steps: list[tuple[str, int]]) -> None:
    state = LedgerState(observer_quota=QUOTA)
    eager = Eager()
    subject_of = {env.content_hash: att.subject for env, att, _ in POOL}
    for kind, arg in steps:
        if kind == "merge":
            env, att, observer = POOL[arg]
            h = env.content_hash
            try:
                added, evicted = state.merge_attestation(env, att, observer, h)
            except Rejected:
                continue
            for gone in evicted:  # evicted before the newcomer is added
                eager.remove(subject_of[gone], gone)
            if added:
                eager.add(att.subject, h)
        elif kind == "prune":
            _, gone_held = state.prune(T0 + arg * HOUR)
            for held in gone_held:
                eager.remove(held.attestation.subject, held.hash)
        else:
            assert state.by_subject == eager.by_subject
            assert state.subject_version == eager.version
    assert state.subject_version == eager.version
    assert state.by_subject == eager.by_subject
    grouped: dict[str, set[bytes]] = {}
    for h, held in state.attestations.items():
        grouped.setdefault(held.attestation.subject, set()).add(h)
    assert state.by_subject == grouped
