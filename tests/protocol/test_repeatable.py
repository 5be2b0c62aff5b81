"""Which message types the replay rule skips: only unsigned ones an honest peer repeats."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing

import protocol
from crypto.envelope import Envelope
from protocol.codec import Message, registered


def _carries_signature(cls: type[Message], depth: int = 0) -> bool:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        for tp in (hints[f.name], *typing.get_args(hints[f.name])):
            if tp is Envelope:
                return True
            if isinstance(tp, type) and issubclass(tp, Message) and depth < 4:
                if _carries_signature(tp, depth + 1):
                    return True
    return False


def test_no_signed_message_type_is_repeatable() -> None:
    for module in pkgutil.walk_packages(protocol.__path__, "protocol."):
        importlib.import_module(module.name)
    types = registered().values()
    signed = [t for t in types if _carries_signature(t)]
    assert len(signed) >= 8  # beacons, bids, assignments, results, commits, verdicts, records
    assert [t.__name__ for t in signed if t.repeatable] == []
    repeatable = {t.__name__ for t in types if t.repeatable}
    assert {"LedgerDigest", "ChunkRequest", "StatesRequest"} <= repeatable
    # a peer exchange answer repeats verbatim while the peer set is unchanged (every 500 ms
    # with fast membership): counted as replays it banned honest peers within a minute
    assert "PeerList" in repeatable
