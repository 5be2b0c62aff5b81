"""Sharing the results of pure functions across virtual nodes, for the length of a run.

In one process the simulator has every virtual node check the very same bytes: ten thousand
signature verifications, peer-id derivations and payload decodings of one gossiped record.
Each of these is a pure function of its arguments whose result is immutable (a bool, a str, a
frozen message), so within :func:`shared_pure_functions` the names that the crypto/ and
protocol/ modules call are bound to memoized wrappers. Every node still runs the whole code
path of its machine (domain, signer, field, time and replay checks) and gets exactly the
answer the real function gives, forgeries and malformed payloads included (an exception is
never cached: it is raised again each time); only the repeated work is shared.
Outside the context nothing is changed.

What is shared: ``crypto.keys.verify_signature`` (as bound in crypto.envelope),
``crypto.peer_id.peer_id_from_public_key`` (as bound in crypto.envelope and crypto.keys),
``protocol.codec.decode`` as bound in every loaded ``protocol.*`` module (keyed by the frame's
bytes), ``protocol.codec.encode`` likewise, keyed by the identity of the (immutable)
message object: a machine that counts the bytes of what it sends and the transport that sends
it encode one object once; and the ledger's envelope checks that depend on the envelope's
bytes alone (``protocol.ledger.records.envelope_hash`` and ``_open``: signature, domain,
version, decoding), keyed by the envelope object, then by its value. Checks that depend on the node (network,
signer, clock, replay, quota) still run on every node.

Also shared: ``protocol.relay.striping.build_striped_plan`` (every node of a relay computes
the same plan from the same manifest; the plan is frozen and only read) and
``protocol.relay.transfer.chunk_indices`` (each node's map from chunk hash to indices, only
read: at 10,000 nodes and 512 chunks, one copy instead of 10,000).

Also shared: the immutable tuples a ledger state keeps per item (``held_attestation``,
``attestation_expiry``, ``record_expiry`` in protocol.ledger.state: made of their arguments,
so one tuple serves every node that holds the item) and ``bucket_digest`` (a hash of bytes).
Ten thousand nodes holding the same items then hold one copy of these, not ten thousand:
less memory, and fewer cold cache lines touched per delivery.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import crypto.envelope
import crypto.keys
from crypto.keys import verify_signature
from crypto.peer_id import peer_id_from_public_key
from protocol import codec
from protocol.ledger import records as ledger_records
from protocol.ledger import state as ledger_state
from protocol.ledger.messages import LedgerDigest
from protocol.relay import striping as relay_striping
from protocol.relay import transfer as relay_transfer

#: distinct argument tuples remembered per function; the oldest are forgotten first
CACHE_ENTRIES = 1 << 17
#: messages whose encoding is remembered by identity
ENCODE_ENTRIES = 1 << 12


class _EncodeByIdentity:
    """``encode(msg)`` remembered per message object (kept alive, so its id is not reused)."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._cache: dict[int, tuple[object, bytes]] = {}
        self._by_value = functools.lru_cache(maxsize=entries)(codec.encode)

    def __call__(self, msg: codec.Message) -> bytes:
        key = id(msg)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is msg:
            return hit[1]
        data = self._by_value(msg) if type(msg) in _ENCODE_BY_VALUE else codec.encode(msg)
        cache = self._cache
        if len(cache) >= self.entries:
            del cache[next(iter(cache))]
        cache[key] = (msg, data)
        return data


#: messages whose encoding is also remembered by value: every node builds its own digest of
#: what it holds, and converged nodes build equal ones. Safe because equal digests encode
#: equally: their fields are str, int, bytes and bool only (no floats: 1 == 1.0 == True would
#: conflate encodings), made by LedgerState, which never puts a bool in an int field.
_ENCODE_BY_VALUE = (LedgerDigest,)

#: the transport's encoder; shared with protocol modules inside ``shared_pure_functions``
encode = _EncodeByIdentity(ENCODE_ENTRIES)


def _targets() -> list[tuple[object, str, Callable[..., Any]]]:
    found: list[tuple[object, str, Callable[..., Any]]] = [
        (crypto.envelope, "verify_signature", verify_signature),
        (crypto.envelope, "peer_id_from_public_key", peer_id_from_public_key),
        (crypto.keys, "peer_id_from_public_key", peer_id_from_public_key),
    ]
    for name in sorted(sys.modules):
        module = sys.modules[name]
        if (name == "protocol" or name.startswith("protocol.")) and name != "protocol.codec":
            for attr, original in _PROTOCOL_FUNCTIONS:
                if getattr(module, attr, None) is original:
                    found.append((module, attr, original))
    return found


def _by_identity(fn: Callable[..., Any], entries: int) -> Callable[..., Any]:
    """``fn(obj, *rest)`` remembered per object (kept alive, so its id is not reused), then by
    value: the simulator hands every node the very same envelope object, so the common case is
    one dict lookup; equal copies (``wire_bytes``: each node decodes its own) share by value.

    A closure rather than an object with ``__call__``: CPython calls plain functions faster,
    and this runs for every item of every delivered push."""
    by_value = functools.lru_cache(maxsize=entries)(fn)
    cache: dict[int, tuple[object, tuple[Any, ...], Any]] = {}

    def shared(obj: object, *rest: Any) -> Any:
        hit = cache.get(id(obj))
        if hit is not None and hit[0] is obj and hit[1] == rest:
            return hit[2]
        result = by_value(obj, *rest)
        if len(cache) >= entries:
            del cache[next(iter(cache))]
        cache[id(obj)] = (obj, rest, result)
        return result

    return shared


def _shared_tuple(
    fn: Callable[..., tuple[Any, ...]], entries: int, *, by_identity: bool
) -> Callable[..., Any]:
    """``fn(*args)``, whose result is the tuple of its arguments, made once per distinct
    ``args`` (looked up by the last, a hash) and handed to every caller. ``by_identity``:
    the same objects (for arguments whose ``==`` is slow Python, like frozen dataclasses),
    else equal values (ints, strs, bytes)."""
    cache: dict[Any, tuple[Any, ...]] = {}

    def shared(*args: Any) -> Any:
        hit = cache.get(args[-1])
        if hit is not None and (
            all(map(operator.is_, hit, args)) if by_identity else hit == args
        ):
            return hit
        # new, or equal values in other objects (the node that made the item has its own;
        # every other node has the gossiped ones): the latest caller's objects are kept
        result = fn(*args)
        if len(cache) >= entries:
            del cache[next(iter(cache))]
        cache[args[-1]] = result
        return result

    return shared


#: pure functions shared wherever a ``protocol.*`` module binds them (by these names)
_PROTOCOL_FUNCTIONS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("decode", codec.decode),
    ("encode", codec.encode),
    ("envelope_hash", ledger_records.envelope_hash),
    ("_open", ledger_records._open),
    ("held_attestation", ledger_state.held_attestation),
    ("attestation_expiry", ledger_state.attestation_expiry),
    ("record_expiry", ledger_state.record_expiry),
    ("bucket_digest", ledger_state.bucket_digest),
    ("build_striped_plan", relay_striping.build_striped_plan),
    ("chunk_indices", relay_transfer.chunk_indices),
)
#: of those, the ones whose first argument is an immutable object handed around as is
_BY_IDENTITY = (ledger_records.envelope_hash, ledger_records._open)
#: of those, the ones that return the tuple of their arguments (-> compared by identity)
_TUPLES = {
    ledger_state.held_attestation: True,
    ledger_state.attestation_expiry: False,
    ledger_state.record_expiry: False,
}


@contextmanager
def shared_pure_functions(entries: int = CACHE_ENTRIES) -> Iterator[None]:
    """Memoize the pure functions above while the context is open (re-entrant)."""
    patched: list[tuple[object, str, Callable[..., Any]]] = []
    for module, attr, original in _targets():
        if getattr(module, attr) is not original:
            continue  # already shared by an enclosing context
        shared: Callable[..., Any]
        if original is codec.encode:
            shared = encode
        elif original in _BY_IDENTITY:
            shared = _by_identity(original, entries)
        elif original in _TUPLES:
            shared = _shared_tuple(original, entries, by_identity=_TUPLES[original])
        else:
            shared = functools.lru_cache(maxsize=entries)(original)
        setattr(module, attr, shared)
        patched.append((module, attr, original))
    try:
        yield
    finally:
        for module, attr, original in patched:
            setattr(module, attr, original)
