"""Sharing the results of pure functions across virtual nodes: the simulator's ``Memo``.

In one process the simulator has every virtual node check the very same bytes: ten thousand
signature verifications, peer-id derivations and payload decodings of one gossiped record.
The machines that do so call those pure functions through the ``protocol.machine.Memo`` they
are built with (``LedgerMachine`` and its ``LedgerState``, ``RelayMachine``: their docstrings
name the functions), and the daemon passes none. Each swarm holds one :class:`SharedResults`
(``swarm.memo``); the adapters of simulations/machines/ hand it to the machines they build
and the transport frames messages with its encoder. So every node still runs the whole code
path of its machine (the network, signer, time, replay and quota checks that depend on the
node) and gets exactly the answer the function gives, forgeries and malformed payloads
included (an exception is never remembered: it is raised again each time); only the repeated
work is shared, and only among the machines of one swarm.

How each function is remembered:

* ``protocol.codec.encode``: by the identity of the (immutable) message object, so a machine
  that counts the bytes it sends and the transport that sends them encode one object once;
  ledger digests also by value (converged nodes build equal ones);
* ``envelope_hash``, ``signed_capability``, ``signed_attestation`` (protocol/ledger/
  records.py): by the identity of the envelope (the simulator hands every node the very same
  object), then by its value (each node's own copy, decoded from bytes);
* ``held_attestation``, ``attestation_expiry``, ``record_expiry`` (protocol/ledger/held.py):
  tuples of their arguments, made once per item and held by every node that holds it: ten
  thousand nodes holding the same items hold one copy of these, not ten thousand;
* anything else (peer ids, bucket digests, whole bucket summaries, digest lines, relay
  manifests, plans and chunk indices): by the value of its arguments (``functools.lru_cache``;
  a summary's argument is a node's every attestation hash, so fewer of those are kept).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, TypeVar, cast

from protocol import codec
from protocol.ledger import held as ledger_held
from protocol.ledger import records as ledger_records
from protocol.ledger.messages import LedgerDigest

F = TypeVar("F", bound=Callable[..., Any])

#: distinct argument tuples remembered per function; the oldest are forgotten first
CACHE_ENTRIES = 1 << 17
#: messages whose encoding is remembered by identity
ENCODE_ENTRIES = 1 << 12


class SharedResults:
    """A ``protocol.machine.Memo`` whose results are shared by every caller: ``memo(fn)`` is
    one remembering wrapper per function, made on first use."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._shared: dict[Callable[..., Any], Callable[..., Any]] = {}

    def __call__(self, fn: F, /) -> F:
        shared = self._shared.get(fn)
        if shared is None:
            shared = self._shared[fn] = self._remembering(fn)
        return cast(F, shared)

    def _remembering(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if fn is codec.encode:
            return _EncodeByIdentity(ENCODE_ENTRIES)
        if fn in _BY_IDENTITY:
            return _by_identity(fn, self.entries)
        by_identity = _TUPLES.get(fn)
        if by_identity is not None:
            return _shared_tuple(fn, self.entries, by_identity=by_identity)
        return functools.lru_cache(maxsize=min(self.entries, _FEWER.get(fn, self.entries)))(fn)


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


def _by_identity(fn: Callable[[Any], Any], entries: int) -> Callable[[Any], Any]:
    """``fn(obj)`` remembered per object (kept alive, so its id is not reused), then by
    value: the simulator hands every node the very same envelope object, so the common case is
    one dict lookup; equal copies (``wire_bytes``: each node decodes its own) share by value.

    A closure of one argument rather than an object with ``__call__``: CPython calls plain
    functions faster, and this runs for every item of every delivered push."""
    by_value = functools.lru_cache(maxsize=entries)(fn)
    cache: dict[int, tuple[object, Any]] = {}

    def shared(obj: object) -> Any:
        hit = cache.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        result = by_value(obj)
        if len(cache) >= entries:
            del cache[next(iter(cache))]
        cache[id(obj)] = (obj, result)
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
    if by_identity and fn.__code__.co_argcount == 4:
        return _shared_4_by_identity(fn, entries, cache)

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


def _shared_4_by_identity(
    fn: Callable[..., tuple[Any, ...]], entries: int, cache: dict[Any, tuple[Any, ...]]
) -> Callable[..., Any]:
    """``_shared_tuple`` by identity for a function of four arguments (``held_attestation``,
    made once per delivered attestation): the four checks spelled out, not mapped."""

    def shared(a: Any, b: Any, c: Any, d: Any) -> Any:
        hit = cache.get(d)
        if hit is not None and hit[0] is a and hit[1] is b and hit[2] is c and hit[3] is d:
            return hit
        result = fn(a, b, c, d)
        if len(cache) >= entries:
            del cache[next(iter(cache))]
        cache[d] = result
        return result

    return shared


#: the functions of one argument, an immutable object handed around as is
_BY_IDENTITY = frozenset(
    {
        ledger_records.envelope_hash,
        ledger_records.signed_capability,
        ledger_records.signed_attestation,
    }
)
#: functions whose arguments are large (a node's whole set of attestation hashes): fewer kept
_FEWER: dict[Callable[..., Any], int] = {ledger_held.bucket_summary_of: 1024}
#: the functions that return the tuple of their arguments -> compared by identity or not
_TUPLES: dict[Callable[..., Any], bool] = {
    ledger_held.held_attestation: True,
    ledger_held.attestation_expiry: False,
    ledger_held.record_expiry: False,
}
