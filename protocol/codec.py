"""The wire codec: messages are frozen dataclasses encoded as msgpack ``[tag, version, ...]``.

Declare a message with the ``@message(tag)`` decorator on a
``@dataclass(frozen=True, slots=True, kw_only=True)``. Field types are read from the class
annotations and checked exactly on decode:

======================  ==========================================================
annotation              on the wire / checks
======================  ==========================================================
``int``                 msgpack int, never a bool; ``limits(lo=, hi=)`` (default int64)
``float``               msgpack float, finite; ``limits(lo=, hi=)``
``bool``                msgpack bool only
``str``                 utf-8 str, ``limits(max_len=)`` characters (default 256)
``bytes``               bin, ``limits(size=)`` exact or ``limits(max_len=)`` (default 256)
``tuple[T, ...]``       array, ``limits(max_items=)`` (default 64); T checked per item
``T | None``            nil or T
an ``Enum`` subclass    its value (int or str), must be a member
a ``@message`` class    nested ``[tag, version, ...]`` array
``Envelope``            ``[public_key, domain, payload, signature]``, see crypto.envelope
======================  ==========================================================

``decode`` checks the frame size before unpacking, unpacks with explicit ``max_*_len`` bounds,
then checks the tag, the version, the field count and every field. Any failure raises the one
``InvalidMessage``. A class may define ``check(self) -> None`` for cross-field rules; decode
calls it and turns its ``ValueError`` into ``InvalidMessage``. No pickle, ever.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import msgpack

from crypto.envelope import Envelope, EnvelopeError
from crypto.unpack import Undecodable, unpack_bounded
from protocol.errors import InvalidMessage

#: default upper bound for one frame on any request/response or gossip message.
MAX_FRAME_BYTES = 1 << 20
DEFAULT_MAX_STR = 256
DEFAULT_MAX_BYTES = 256
DEFAULT_MAX_ITEMS = 64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: nested messages deeper than this are refused (stack-exhaustion guard).
MAX_DEPTH = 8


class Message:
    """Base of every wire message. Subclasses get TAG and VERSION from ``@message``."""

    TAG: ClassVar[int]
    VERSION: ClassVar[int]
    #: An honest peer may send the same bytes of this type again and again (a periodic digest,
    #: a poll, a request for the same data): the receiver's replay rule does not apply to it,
    #: only its rate limit. False for everything signed, where a verbatim copy is a replay.
    repeatable: ClassVar[bool] = False
    __slots__ = ()


M = TypeVar("M", bound=Message)
_REGISTRY: dict[int, type[Message]] = {}
_Checker = Callable[[object, int], object]
_FIELDS: dict[type[Message], tuple[tuple[str, _Checker], ...]] = {}
#: how many leading fields a frame must carry: trailing fields with a default may be absent
#: (a field added at the end of a message keeps frames from before it decodable)
_REQUIRED: dict[type[Message], int] = {}


def limits(
    *,
    lo: float | None = None,
    hi: float | None = None,
    max_len: int | None = None,
    size: int | None = None,
    max_items: int | None = None,
    default: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field carrying decode limits in its metadata."""
    meta = {"lo": lo, "hi": hi, "max_len": max_len, "size": size, "max_items": max_items}
    meta = {k: v for k, v in meta.items() if v is not None}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _fail(path: str, what: str) -> InvalidMessage:
    return InvalidMessage(f"{path}: {what}")


def _optional_checker(tp: Any, meta: dict[str, Any], path: str) -> _Checker:
    """``T | None``: nil, or a value ``T``'s checker accepts."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) != 1 or type(None) not in typing.get_args(tp):
        raise TypeError(f"{path}: only `T | None` unions are supported")
    inner = _checker(args[0], meta, path)
    return lambda v, d: None if v is None else inner(v, d)


def _tuple_checker(tp: Any, meta: dict[str, Any], path: str) -> _Checker:
    """``tuple[T, ...]``: an array of at most ``max_items``, each item checked as ``T``."""
    items = typing.get_args(tp)
    if len(items) != 2 or items[1] is not Ellipsis:
        raise TypeError(f"{path}: only homogeneous tuple[T, ...] is supported")
    item = _checker(items[0], {k: v for k, v in meta.items() if k != "max_items"}, path + "[]")
    max_items = meta.get("max_items", DEFAULT_MAX_ITEMS)

    def check_tuple(v: object, d: int) -> object:
        if type(v) is not tuple:
            raise _fail(path, f"expected an array, got {type(v).__name__}")
        if len(v) > max_items:
            raise _fail(path, f"{len(v)} items exceed the limit of {max_items}")
        return tuple(item(x, d) for x in v)

    return check_tuple


def _bool_checker(meta: dict[str, Any], path: str) -> _Checker:
    def check_bool(v: object, d: int) -> object:
        if type(v) is not bool:
            raise _fail(path, f"expected a bool, got {type(v).__name__}")
        return v

    return check_bool


def _int_checker(meta: dict[str, Any], path: str) -> _Checker:
    lo, hi = meta.get("lo", INT64_MIN), meta.get("hi", INT64_MAX)

    def check_int(v: object, d: int) -> object:
        if type(v) is not int:
            raise _fail(path, f"expected an int, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise _fail(path, f"{v} is outside [{lo}, {hi}]")
        return v

    return check_int


def _float_checker(meta: dict[str, Any], path: str) -> _Checker:
    flo, fhi = meta.get("lo", -math.inf), meta.get("hi", math.inf)

    def check_float(v: object, d: int) -> object:
        if type(v) is not float:
            raise _fail(path, f"expected a float, got {type(v).__name__}")
        if not math.isfinite(v) or not flo <= v <= fhi:
            raise _fail(path, f"{v} is not finite or outside [{flo}, {fhi}]")
        return v

    return check_float


def _str_checker(meta: dict[str, Any], path: str) -> _Checker:
    max_len = meta.get("max_len", DEFAULT_MAX_STR)

    def check_str(v: object, d: int) -> object:
        if type(v) is not str:
            raise _fail(path, f"expected a string, got {type(v).__name__}")
        if len(v) > max_len:
            raise _fail(path, f"string of {len(v)} chars exceeds {max_len}")
        return v

    return check_str


def _bytes_checker(meta: dict[str, Any], path: str) -> _Checker:
    size, max_bytes = meta.get("size"), meta.get("max_len", DEFAULT_MAX_BYTES)

    def check_bytes(v: object, d: int) -> object:
        if type(v) is not bytes:
            raise _fail(path, f"expected bytes, got {type(v).__name__}")
        if size is not None and len(v) != size:
            raise _fail(path, f"expected exactly {size} bytes, got {len(v)}")
        if len(v) > max_bytes:
            raise _fail(path, f"{len(v)} bytes exceed {max_bytes}")
        return v

    return check_bytes


def _envelope_checker(meta: dict[str, Any], path: str) -> _Checker:
    def check_envelope(v: object, d: int) -> object:
        try:
            return Envelope.from_wire(v)
        except EnvelopeError as exc:
            raise _fail(path, str(exc)) from None

    return check_envelope


def _enum_checker(enum_type: type[enum.Enum], path: str) -> _Checker:
    def check_enum(v: object, d: int) -> object:
        if type(v) not in (int, str):
            raise _fail(path, f"expected an enum value, got {type(v).__name__}")
        try:
            return enum_type(v)
        except ValueError:
            raise _fail(path, f"{v!r} is not a {enum_type.__name__}") from None

    return check_enum


#: the checker builder for each plain field type, given the field's limits and its path
_PLAIN_CHECKERS: dict[object, Callable[[dict[str, Any], str], _Checker]] = {
    bool: _bool_checker,
    int: _int_checker,
    float: _float_checker,
    str: _str_checker,
    bytes: _bytes_checker,
    Envelope: _envelope_checker,
}


def _checker(tp: Any, meta: dict[str, Any], path: str) -> _Checker:
    """The decode check for one field of annotation ``tp`` (see the table at the top)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _optional_checker(tp, meta, path)
    if origin is tuple:
        return _tuple_checker(tp, meta, path)
    plain = _PLAIN_CHECKERS.get(tp)
    if plain is not None:
        return plain(meta, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_checker(tp, path)
    if isinstance(tp, type) and issubclass(tp, Message):
        nested = tp
        return lambda v, d: _from_array(v, d + 1, expect=nested)
    raise TypeError(f"{path}: unsupported field type {tp!r}")


def message(tag: int, *, version: int = 1) -> Callable[[type[M]], type[M]]:
    """Register a frozen dataclass as wire message ``tag``."""

    def register(cls: type[M]) -> type[M]:
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
            raise TypeError(f"{cls.__name__} must be a frozen dataclass")
        if tag in _REGISTRY and _REGISTRY[tag].__qualname__ != cls.__qualname__:
            raise TypeError(f"tag {tag} is taken by {_REGISTRY[tag].__name__}")
        cls.TAG = tag
        cls.VERSION = version
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = tuple(
            (f.name, _checker(hints[f.name], dict(f.metadata), f"{cls.__name__}.{f.name}"))
            for f in dataclasses.fields(cls)
        )
        required = 0
        for i, f in enumerate(dataclasses.fields(cls)):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required = i + 1
        _REQUIRED[cls] = required
        _REGISTRY[tag] = cls
        return cls

    return register


def to_wire(value: object) -> object:
    """One field's value as msgpack packs it (a message as its array, an envelope as its
    four fields, an enum as its value, a tuple item by item)."""
    if isinstance(value, Message):
        return to_array(value)
    if isinstance(value, Envelope):
        return value.to_wire()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [to_wire(v) for v in value]
    return value


def to_array(msg: Message) -> list[object]:
    """``[tag, version, *fields]``: what :func:`encode` packs."""
    return [msg.TAG, msg.VERSION, *(to_wire(getattr(msg, name)) for name, _ in _FIELDS[type(msg)])]


def encode(msg: Message) -> bytes:
    """The canonical bytes of ``msg`` (deterministic: same message, same bytes)."""
    data: bytes = msgpack.packb(to_array(msg), use_bin_type=True)
    return data


def _from_array(value: object, depth: int, expect: type[M] | None = None) -> Any:
    if depth > MAX_DEPTH:
        raise InvalidMessage(f"messages nested deeper than {MAX_DEPTH}")
    if type(value) is not tuple or len(value) < 2:
        raise InvalidMessage("a message is an array [tag, version, fields...]")
    tag, version = value[0], value[1]
    if type(tag) is not int or type(version) is not int:
        raise InvalidMessage("message tag and version must be ints")
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise InvalidMessage(f"unknown message tag {tag}")
    if expect is not None and cls is not expect and not issubclass(cls, expect):
        raise InvalidMessage(f"expected a {expect.__name__}, got a {cls.__name__}")
    if version != cls.VERSION:
        raise InvalidMessage(f"{cls.__name__} version {version} is not supported ({cls.VERSION})")
    fields = _FIELDS[cls]
    if not _REQUIRED[cls] <= len(value) - 2 <= len(fields):
        raise InvalidMessage(f"{cls.__name__} has {len(fields)} fields, got {len(value) - 2}")
    kwargs = {name: check(v, depth) for (name, check), v in zip(fields, value[2:], strict=False)}
    try:
        msg = cls(**kwargs)
        check_fn = getattr(msg, "check", None)
        if check_fn is not None:
            check_fn()
    except InvalidMessage:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidMessage(f"{cls.__name__}: {exc}") from None
    return msg


def decode(
    frame: bytes,
    expect: type[M] = Message,  # type: ignore[assignment]
    *,
    max_frame: int = MAX_FRAME_BYTES,
) -> M:
    """Decode one frame, raising InvalidMessage for anything that is not a valid ``expect``."""
    if type(frame) is not bytes:
        raise InvalidMessage("a frame must be bytes")
    if len(frame) > max_frame:
        raise InvalidMessage(f"frame of {len(frame)} bytes exceeds {max_frame}")
    try:
        # no message has a map: a map is always an error (unpack_bounded refuses one)
        value = unpack_bounded(frame, max_str=max_frame, max_bin=max_frame,
                               max_array=min(max_frame, 1 << 16))
    except Undecodable as exc:
        raise InvalidMessage(f"not a msgpack frame: {exc}") from None
    result: M = _from_array(value, 0, expect=None if expect is Message else expect)
    return result


def registered() -> dict[int, type[Message]]:
    """Tag -> message class, for tests and docs."""
    return dict(_REGISTRY)


def peek_tag_version(payload: bytes) -> tuple[int, int] | None:
    """The (tag, version) heading a payload, or None when it does not start like a message
    (read without decoding the rest: a receiver tells an unknown version from garbage)."""
    unpacker = msgpack.Unpacker(max_buffer_size=len(payload) + 1)
    unpacker.feed(payload)
    try:
        if unpacker.read_array_header() < 2:
            return None
        tag, version = unpacker.unpack(), unpacker.unpack()
    except Exception:  # msgpack raises many types on garbage
        return None
    if type(tag) is not int or type(version) is not int:
        return None
    return tag, version
