"""The wire codec: round trips, golden bytes, and a table of malformed frames."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.codec import MAX_DEPTH, Message, decode, encode, limits, message
from protocol.errors import InvalidMessage
from protocol.membership.messages import Hello, PeerInfo, PeerList, Ping


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


@message(19)  # the last core tag, reserved for this test
@dataclass(frozen=True, slots=True, kw_only=True)
class Sample(Message):
    n: int = limits(lo=0, hi=1000)
    x: float = limits(lo=-1.0, hi=1.0)
    flag: bool
    name: str = limits(max_len=8)
    blob: bytes = limits(size=4)
    tags: tuple[str, ...] = limits(max_items=3, max_len=5)
    maybe: int | None
    color: Color
    env: Envelope
    nested: Ping | None

    def check(self) -> None:
        if self.name == "bad":
            raise ValueError("name may not be 'bad'")


ENV = Envelope.sign(Identity.from_seed(b"\x05" * 32), "symphony/test/v1", b"p")


def sample(**kw: object) -> Sample:
    base: dict[str, object] = dict(n=5, x=0.5, flag=True, name="ok", blob=b"abcd", tags=("a",),
                                   maybe=None, color=Color.RED, env=ENV, nested=Ping(nonce=3))
    base.update(kw)
    return Sample(**base)  # type: ignore[arg-type]


def fields_of(msg: Sample) -> list[object]:
    return list(msgpack.unpackb(encode(msg), use_list=True))


def test_round_trip_and_golden_bytes() -> None:
    hello = Hello(network_id="net", protocol_version=1, agent_version="a/1",
                  listen_addrs=("/ip4/127.0.0.1/tcp/1",))
    assert encode(hello).hex() == "960101a36e657401a3612f3191b42f6970342f3132372e302e302e312f7463702f31"
    assert decode(encode(hello), Hello) == hello
    s = sample()
    assert decode(encode(s)) == s
    pl = PeerList(peers=(PeerInfo(peer_id="p", addrs=("a",)),))
    assert decode(encode(pl), PeerList) == pl


def _frame(mutate: object) -> bytes:
    arr = fields_of(sample())
    if callable(mutate):
        mutate(arr)
    return msgpack.packb(arr, use_bin_type=True)


def _set(i: int, v: object):  # type: ignore[no-untyped-def]
    def f(arr: list[object]) -> None:
        arr[i] = v
    return f


# field index in the array: 0 tag, 1 version, then n, x, flag, name, blob, tags, maybe, color, env, nested
MALFORMED = {
    "empty": b"",
    "truncated": encode(sample())[:-3],
    "trailing garbage": encode(sample()) + b"\x00",
    "not an array": msgpack.packb(5),
    "map": msgpack.packb({"tag": 19}),
    "huge map": b"\xdf\xff\xff\xff\xff",
    "huge array header": b"\xdd\xff\xff\xff\xff",
    "unknown tag": msgpack.packb([4242, 1]),
    "tag is str": msgpack.packb(["19", 1]),
    "wrong version": _frame(_set(1, 2)),
    "missing field": _frame(lambda a: a.pop()),
    "extra field": _frame(lambda a: a.append(1)),
    "bool for int": _frame(_set(2, True)),
    "int out of range": _frame(_set(2, 1001)),
    "negative int": _frame(_set(2, -1)),
    "float for int": _frame(_set(2, 5.0)),
    "int for float": _frame(_set(3, 1)),
    "nan": _frame(_set(3, float("nan"))),
    "int for bool": _frame(_set(4, 1)),
    "bytes for str": _frame(_set(5, b"ok")),
    "long str": _frame(_set(5, "x" * 9)),
    "short bytes": _frame(_set(6, b"abc")),
    "str for bytes": _frame(_set(6, "abcd")),
    "too many items": _frame(_set(7, ["a", "b", "c", "d"])),
    "item type": _frame(_set(7, [1])),
    "long item": _frame(_set(7, ["xxxxxx"])),
    "not an enum member": _frame(_set(9, "green")),
    "bad envelope": _frame(_set(10, [b"k", "d", b"p", b"s"])),
    "wrong nested type": _frame(_set(11, [1, 1, "net", 1, "a", []])),
    "check() refuses": _frame(_set(5, "bad")),
    "invalid utf-8": msgpack.packb([19, 1]).replace(b"\x92", b"\x93") + b"\xa2\xff\xfe",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_frames_raise_invalid_message(name: str) -> None:
    with pytest.raises(InvalidMessage):
        decode(MALFORMED[name])


def test_oversized_frame_is_refused_before_unpacking() -> None:
    with pytest.raises(InvalidMessage, match="exceeds 100"):
        decode(b"\x00" * 101, max_frame=100)


def test_expected_type_is_enforced() -> None:
    with pytest.raises(InvalidMessage, match="expected a Hello"):
        decode(encode(Ping(nonce=1)), Hello)


def test_deep_nesting_is_refused() -> None:
    frame: object = [2, 1, 0]
    for _ in range(MAX_DEPTH + 400):
        frame = [frame]
    with pytest.raises(InvalidMessage):
        decode(msgpack.packb(frame))


def test_tags_are_unique() -> None:
    with pytest.raises(TypeError, match="tag 2 is taken"):
        @message(2)
        @dataclass(frozen=True, slots=True, kw_only=True)
        class Clash(Message):
            a: int


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_escape_as_another_error(data: bytes) -> None:
    try:
        decode(data)
    except InvalidMessage:
        pass


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 1000),
    x=st.floats(-1.0, 1.0),
    flag=st.booleans(),
    name=st.text(max_size=8).filter(lambda s: s != "bad"),
    tags=st.lists(st.text(max_size=5), max_size=3).map(tuple),
    maybe=st.none() | st.integers(-(2**63), 2**63 - 1),
)
def test_round_trip_property(n: int, x: float, flag: bool, name: str, tags: tuple[str, ...],
                             maybe: int | None) -> None:
    s = sample(n=n, x=x, flag=flag, name=name, tags=tags, maybe=maybe)
    assert decode(encode(s)) == s
    assert encode(decode(encode(s))) == encode(s)
