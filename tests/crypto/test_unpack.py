import msgpack
import pytest

from crypto.unpack import Undecodable, unpack_bounded


def test_decodes_within_bounds_as_tuples_with_str_and_bytes_apart() -> None:
    data = msgpack.packb([1, "ab", b"cd", [2, 3]], use_bin_type=True)
    assert unpack_bounded(data, max_str=2, max_bin=2, max_array=4) == (1, "ab", b"cd", (2, 3))


@pytest.mark.parametrize("value, why", [
    ({"a": 1}, "map"),
    ("abc", "str"),
    (b"abc", "bin"),
    ([1, 2, 3, 4, 5], "array"),
    (msgpack.ExtType(1, b"x"), "ext"),
])
def test_refuses_what_passes_the_bounds(value: object, why: str) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    with pytest.raises(Undecodable):
        unpack_bounded(data, max_str=2, max_bin=2, max_array=4)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01", msgpack.packb(1) + b"\x01"])
def test_refuses_garbage_truncation_and_trailing_bytes(data: bytes) -> None:
    with pytest.raises(Undecodable):
        unpack_bounded(data, max_str=8, max_bin=8, max_array=8)
