"""Hypothesis strategies for fuzzing the wire: well-typed messages and mutated frames.

* :func:`messages_of` draws an instance of a registered ``@message`` class whose every field
  respects the class's declared limits (so it encodes, and decodes unless its own ``check``
  refuses it). Envelope fields carry real signatures over random payloads.
* :func:`mutations_of` turns a valid frame into a hostile one: byte-level damage (flips,
  truncation, insertion, deletion, duplication, a different length) or structural damage
  (one element anywhere in the decoded array replaced by a value of a random msgpack type,
  an element dropped or added), so the tag and version usually survive and decoding goes deep.
* :data:`HOSTILE_VALUES` are msgpack values a peer may put anywhere: extremes of every type.

Everything is deterministic under ``@settings(derandomize=True)``.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import msgpack
from hypothesis import strategies as st

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol import codec
from protocol.codec import Message

SIGNERS = [Identity.from_seed(bytes([200 + i]) * 32) for i in range(3)]
#: strings longer than this are drawn only at their limit (keeps examples small and fast)
_MAX_DRAWN_LEN = 64

HOSTILE_VALUES: st.SearchStrategy[object] = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from([0, -1, 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1]),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.binary(max_size=80),
    st.sampled_from([b"", "", b"\x00" * 32, b"\xff" * 64, "x" * 300, b"\x00" * 5000]),
    st.lists(st.integers(-3, 100) | st.binary(max_size=8), max_size=5),
)


def _sized(max_len: int, exact: int | None = None) -> tuple[int, int]:
    if exact is not None:
        return exact, exact
    return 0, min(max_len, _MAX_DRAWN_LEN)


def _envelopes() -> st.SearchStrategy[Envelope]:
    return st.builds(
        lambda who, domain, payload: Envelope.sign(who, domain, payload),
        st.sampled_from(SIGNERS),
        st.sampled_from(["symphony/test/v1", "symphony/market/bid/v1", "symphony/ledger/v1"]),
        st.binary(max_size=64),
    )


def _field_strategy(tp: Any, meta: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return st.none() | _field_strategy(inner, meta, depth)
    if origin is tuple:
        item_meta = {k: v for k, v in meta.items() if k != "max_items"}
        max_items = min(meta.get("max_items", codec.DEFAULT_MAX_ITEMS), 4)
        item = _field_strategy(typing.get_args(tp)[0], item_meta, depth)
        return st.lists(item, max_size=max_items).map(tuple)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(int(meta.get("lo", codec.INT64_MIN)), int(meta.get("hi", codec.INT64_MAX)))
    if tp is float:
        lo, hi = meta.get("lo"), meta.get("hi")
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False)
    if tp is str:
        lo, hi = _sized(meta.get("max_len", codec.DEFAULT_MAX_STR))
        return st.text(min_size=lo, max_size=hi)
    if tp is bytes:
        lo, hi = _sized(meta.get("max_len", codec.DEFAULT_MAX_BYTES), meta.get("size"))
        return st.binary(min_size=lo, max_size=hi)
    if tp is Envelope:
        return _envelopes()
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and issubclass(tp, Message):
        return messages_of(tp, depth + 1)
    raise TypeError(f"no strategy for field type {tp!r}")


def messages_of(cls: type[Message], depth: int = 0) -> st.SearchStrategy[Message]:
    """Instances of ``cls`` within its declared limits (``check`` may still refuse them)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: _field_strategy(hints[f.name], dict(f.metadata), depth)
              for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def build(kwargs: dict[str, Any]) -> Message:
        try:
            return cls(**kwargs)
        except (ValueError, TypeError):  # a __post_init__ rule: keep the draw, unconstructed
            return Unbuilt(cls, kwargs)

    return st.fixed_dictionaries(fields).map(build)


class Unbuilt(Message):
    """Field values the class's constructor refused; encoded as the array they would form."""

    __slots__ = ("cls", "kwargs")

    def __init__(self, cls: type[Message], kwargs: dict[str, Any]) -> None:
        self.cls = cls
        self.kwargs = kwargs


def _wire(value: object) -> object:
    """The msgpack form of a field value; unconstructed draws become the array they form."""
    if isinstance(value, Unbuilt):
        names = [f.name for f in dataclasses.fields(value.cls)]  # type: ignore[arg-type]
        return [value.cls.TAG, value.cls.VERSION, *(_wire(value.kwargs[n]) for n in names)]
    if isinstance(value, Message):
        names = [f.name for f in dataclasses.fields(value)]  # type: ignore[arg-type]
        return [value.TAG, value.VERSION, *(_wire(getattr(value, n)) for n in names)]
    if isinstance(value, tuple):
        return [_wire(v) for v in value]
    return codec.to_wire(value)


def frame_of(msg: Message) -> bytes:
    """The wire bytes of ``msg`` (also of an unconstructed draw, or one holding such)."""
    return bytes(msgpack.packb(_wire(msg), use_bin_type=True))


def all_message_classes() -> list[type[Message]]:
    """Every registered wire message (importing every message module first)."""
    import protocol.agents.cards  # noqa: F401
    import protocol.agents.plans  # noqa: F401
    import protocol.inference.messages  # noqa: F401
    import protocol.ledger.messages  # noqa: F401
    import protocol.ledger.records  # noqa: F401
    import protocol.market.messages  # noqa: F401
    import protocol.market.progress  # noqa: F401
    import protocol.membership.discovery_messages  # noqa: F401
    import protocol.membership.messages  # noqa: F401
    import protocol.relay.manifest  # noqa: F401
    import protocol.rl.messages  # noqa: F401
    import protocol.verification.messages  # noqa: F401

    return [cls for _, cls in sorted(codec.registered().items())
            if cls.__module__ != "tests.protocol.test_codec"]


# ---------------------------------------------------------------- mutations


def _byte_mutation(data: st.DataObject, frame: bytes) -> bytes:
    kind = data.draw(st.sampled_from(
        ["flip", "truncate", "insert", "delete", "duplicate", "append", "random", "prefix"]))
    n = len(frame)
    at = data.draw(st.integers(0, max(0, n - 1)))
    if kind == "flip" and n:
        return frame[:at] + bytes([frame[at] ^ data.draw(st.integers(1, 255))]) + frame[at + 1:]
    if kind == "truncate":
        return frame[:at]
    if kind == "insert":
        return frame[:at] + data.draw(st.binary(min_size=1, max_size=16)) + frame[at:]
    if kind == "delete":
        return frame[:at] + frame[at + data.draw(st.integers(1, 16)):]
    if kind == "duplicate":
        return frame[:at] + frame[at:] * 2
    if kind == "append":
        return frame + data.draw(st.binary(min_size=1, max_size=16))
    if kind == "prefix":  # a bogus array/str/bin header announcing a huge length
        header = data.draw(st.sampled_from(
            [b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
             b"\xdc\xff\xff", b"\xdf\x00\x00\x00\x01"]))
        return header + frame
    return data.draw(st.binary(max_size=max(1, 2 * n)))


def _paths(value: object, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, prefix + (i,))
    return out


def _structural_mutation(data: st.DataObject, frame: bytes) -> bytes:
    array = msgpack.unpackb(frame, raw=False, use_list=True)
    paths = _paths(array)
    path = data.draw(st.sampled_from(paths)) if paths else ()
    kind = data.draw(st.sampled_from(["replace", "replace", "drop", "add"]))
    if not path:
        return bytes(msgpack.packb(data.draw(HOSTILE_VALUES), use_bin_type=True))
    parent: Any = array
    for i in path[:-1]:
        parent = parent[i]
    last = path[-1]
    if kind == "replace":
        parent[last] = data.draw(HOSTILE_VALUES)
    elif kind == "drop":
        del parent[last]
    else:
        parent.insert(last, data.draw(HOSTILE_VALUES))
    return bytes(msgpack.packb(array, use_bin_type=True))


def mutate(data: st.DataObject, frame: bytes) -> bytes:
    """One hostile variant of a valid ``frame``, drawn from ``data``."""
    if data.draw(st.booleans()):
        return _byte_mutation(data, frame)
    return _structural_mutation(data, frame)
