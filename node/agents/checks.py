"""The text embedder as the daemon uses it, and the check that a peer's agent card carries its
own description's vector.

Where the check sits
--------------------
The ledger machine (sans-IO) accepts an agent-card record once its size, signature, fields and
times pass (protocol/agents/cards.py). Whether a card's vector is its description's takes the
embedder, which protocol/ must not run, so the daemon's ledger service hands every new record
of another node to :class:`CardChecker` (``note``). The checker re-embeds the descriptions in
a worker thread (``trio.to_thread``), compares with ``vector_agrees`` and:

* all agree: the record's cards with our embedder's vectors are *verified*
  (``verified_cards``); matching may use their vectors;
* one disagrees: it submits ``RefuseAgentCards`` to the ledger machine, which drops the record
  (remembering that version, so it is not merged or pulled again) and penalizes its author
  (``Rejection.VECTOR_MISMATCH``);
* a card without a vector, or with another embedder's (another hash), is kept, unverified:
  its vector is not comparable and matching falls back to its skill tags. So is every card on
  a node whose embedder is off or not installed (a light node).

A record is unverified until its check has run: callers use only verified vectors.

Bounded work: one check per node waits at a time (a newer record of that node replaces the
one waiting), nodes are served in arrival order by one task, a check embeds at most
``MAX_AGENTS_PER_NODE`` descriptions, and vectors are cached by (description, embedder hash),
so a node that republishes the same cards costs no embedding.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from models.embedder import HASH_FILE, EmbedderUnavailable, default_embedder, model_dir
from protocol.agents.matching import vector_agrees
from protocol.ledger.cards import HeldCards

#: descriptions whose vectors are kept (a node holds at most MAX_AGENTS_PER_NODE cards per
#: peer; this covers a few hundred nodes' agents without re-embedding)
VECTOR_CACHE_ENTRIES = 2048
#: characters of an embedding failure kept in ``CardEmbedder.problem`` (status, logs)
MAX_PROBLEM = 200


class TextEmbedder(Protocol):
    """What the daemon needs of models/embedder.py's ``Embedder``."""

    hash: bytes

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def installed_hash() -> bytes:
    """The installed embedder's hash, read beside its extracted files: no model is loaded, so
    a card of another embedder never costs a model load (blocking: may extract the zip)."""
    try:
        return bytes.fromhex((model_dir() / HASH_FILE).read_text().strip())
    except (OSError, ValueError) as exc:
        raise EmbedderUnavailable(f"the embedder's hash is unreadable: {exc}") from None


class CardEmbedder:
    """The process's embedder, loaded on first use in a worker thread; None-returning when it
    is off (``enabled`` false) or not installed. Thread-safe: one embedding at a time.
    ``load`` and ``peek_hash`` are models/embedder.py's unless a test passes its own."""

    def __init__(self, enabled: bool = True,
                 load: Callable[[], TextEmbedder] = default_embedder,
                 peek_hash: Callable[[], bytes] = installed_hash) -> None:
        self.enabled = enabled
        self._load = load
        self._peek_hash = peek_hash
        self._lock = threading.Lock()
        self._embedder: TextEmbedder | None = None
        self._hash: bytes | None = None
        self._tried = False
        #: why there are no vectors ("" while none is known)
        self.problem = "" if enabled else "agent embeddings are off ([ledger] agent_embeddings)"
        self._cache: OrderedDict[tuple[str, bytes], list[float]] = OrderedDict()

    def known_hash(self) -> bytes | None:
        """Our embedder's hash, without loading the model (blocking: reads the cache dir)."""
        if not self.enabled:
            return None
        if self._hash is None:
            try:
                self._hash = self._peek_hash()
            except EmbedderUnavailable as exc:
                self.problem = str(exc)
                return None
        return self._hash

    def embed(self, texts: Sequence[str]) -> list[list[float]] | None:
        """One unit vector per text (blocking: run it in a thread), or None without an
        embedder. Vectors are cached by (text, embedder hash). A model that raises gives
        None too, with ``problem`` saying why: cards go out without vectors (and peers' stay
        unverified) rather than the error ending the ledger service, and the daemon with it."""
        with self._lock:
            embedder = self._loaded()
            if embedder is None:
                return None
            missing = [t for t in dict.fromkeys(texts) if (t, embedder.hash) not in self._cache]
            try:
                vectors = embedder.embed(missing) if missing else []
            except Exception as exc:  # a broken model: no vectors, no crash
                self.problem = f"embedding failed: {type(exc).__name__}: {exc}"[:MAX_PROBLEM]
                return None
            for text, vector in zip(missing, vectors, strict=True):
                self._cache[(text, embedder.hash)] = vector
            out = []
            for text in texts:
                self._cache.move_to_end((text, embedder.hash))
                out.append(self._cache[(text, embedder.hash)])
            while len(self._cache) > VECTOR_CACHE_ENTRIES:
                self._cache.popitem(last=False)
            return out

    async def embed_async(self, texts: Sequence[str]) -> list[list[float]] | None:
        """``embed`` in a worker thread (the event loop never waits on the model). A cancelled
        caller abandons the thread (it finishes under the lock and only fills the cache), so a
        daemon stopped while the embedder loads shuts down within its grace."""
        return await trio.to_thread.run_sync(self.embed, list(texts), abandon_on_cancel=True)

    def _loaded(self) -> TextEmbedder | None:
        if self._embedder is None and self.enabled and not self._tried:
            self._tried = True
            try:
                self._embedder = self._load()
                self._hash = self._embedder.hash
            except Exception as exc:  # no models extra, a broken install: no vectors, no crash
                self.problem = f"{type(exc).__name__}: {exc}"
        return self._embedder


class CardChecker:
    """Checks peers' cards' vectors against their descriptions (see the module docstring)."""

    def __init__(self, embedder: CardEmbedder,
                 refuse: Callable[[str, bytes, str], Awaitable[None]], log: Any) -> None:
        self.embedder = embedder
        self._refuse = refuse
        self.log = log
        #: node -> its newest record waiting for a check (insertion order: arrival order)
        self.pending: dict[str, HeldCards] = {}
        #: node -> (record hash, names of its cards whose vectors were verified)
        self.verdicts: dict[str, tuple[bytes, frozenset[str]]] = {}
        self._wake = trio.Event()
        self.checked = 0
        self.refused = 0

    def note(self, held: HeldCards) -> None:
        """A new record of another node arrived: check it (replacing one still waiting)."""
        peer = held.record.peer_id
        self.pending.pop(peer, None)
        self.pending[peer] = held
        self._wake.set()

    def forget(self, peer: str) -> None:
        self.pending.pop(peer, None)
        self.verdicts.pop(peer, None)

    def verified_cards(self, peer: str, record_hash: bytes) -> frozenset[str]:
        """Names of the cards of ``peer``'s record ``record_hash`` whose vectors agreed."""
        verdict = self.verdicts.get(peer)
        return verdict[1] if verdict is not None and verdict[0] == record_hash else frozenset()

    async def run(self) -> None:
        while True:
            if not self.pending:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            peer = next(iter(self.pending))
            await self.check(self.pending.pop(peer))

    async def check(self, held: HeldCards) -> None:
        peer, record = held.record.peer_id, held.record
        ours = await trio.to_thread.run_sync(self.embedder.known_hash, abandon_on_cancel=True)
        cards = [c for c in record.cards if ours is not None and c.embedder_hash == ours]
        vectors = await self.embedder.embed_async([c.description for c in cards]) if cards else None
        self.checked += 1
        if ours is None or vectors is None:  # nothing comparable (or no embedder): unverified
            self.verdicts[peer] = (held.hash, frozenset())
            return
        bad = [c.name for c, v in zip(cards, vectors, strict=True)
               if not vector_agrees(c.vector(ours) or [], v)]
        if bad:
            self.refused += 1
            self.log.warning("agents.vector_mismatch", peer=peer, agents=bad)
            await self._refuse(peer, held.hash, f"vectors of {bad} are not their descriptions'")
            return
        self.verdicts[peer] = (held.hash, frozenset(c.name for c in cards))
