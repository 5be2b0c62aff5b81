"""Decoding msgpack bytes that came from a peer: the one rule every wire reader applies.

Untrusted bytes are decoded with str and bin kept apart (``raw=False``), arrays as tuples,
no maps and no extension types (no wire format here uses them, so one is always an error),
and every length bounded by the caller, so a hostile frame cannot make the decoder allocate
more than the frame's own limits allow. Anything msgpack refuses raises ``Undecodable``.
"""

from __future__ import annotations

import msgpack


class Undecodable(ValueError):
    """The bytes are not msgpack within the reader's bounds."""


def unpack_bounded(data: bytes, *, max_str: int, max_bin: int, max_array: int) -> object:
    """The value msgpack-encoded in ``data``, with strings of at most ``max_str`` chars,
    byte strings of at most ``max_bin`` bytes and arrays of at most ``max_array`` items."""
    try:
        return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True,
                               max_str_len=max_str, max_bin_len=max_bin,
                               max_array_len=max_array, max_map_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises a zoo of types on bad input
        raise Undecodable(f"{type(exc).__name__}: {exc}") from None
