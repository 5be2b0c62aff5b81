"""A driver whose traffic the local API can watch: metrics and the dashboard's live view.

``ObservedDriver`` is the daemon's :class:`node.driver.Driver` plus a list of observers. Each
observer is called synchronously, on the event loop, with ``(service_name, item)`` for:

* every event fed to a service's machine (``Received`` from a peer, ``Tick``, a local event
  such as ``ComputeDone``), before the machine handles it;
* every effect a machine returns (``Send``, ``Publish``, ``Emit``, service effects), before
  it is performed;
* every penalty the driver counts, as ``PenaltyNoted`` under the name ``"driver"``.

Observers only count and remember; they must be cheap and must not raise (an exception is
logged and the observer is left in place: the node's work never depends on one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.driver import Driver

Observer = Callable[[str, object], None]


@dataclass(frozen=True, slots=True)
class PenaltyNoted:
    """The driver counted a penalty of ``kind`` against ``peer``; ``banned`` if it banned it."""

    peer: str
    kind: str
    points: int
    banned: bool


class ObservedDriver(Driver):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.observers: list[Observer] = []

    def _notify(self, name: str, item: object) -> None:
        for observer in self.observers:
            try:
                observer(name, item)
            except Exception:
                self.log.exception("driver.observer_error", observer=repr(observer),
                                   item=type(item).__name__)

    async def _feed(self, name: str, event: object) -> None:
        self._notify(name, event)
        await super()._feed(name, event)

    async def _perform(self, name: str, effect: object) -> None:
        self._notify(name, effect)
        await super()._perform(name, effect)

    def penalize(self, peer: str, reason: str, points: int, *, kind: str = "invalid") -> None:
        was_banned = self.is_banned(peer)
        super().penalize(peer, reason, points, kind=kind)
        self._notify("driver", PenaltyNoted(peer, kind, points,
                                            not was_banned and self.is_banned(peer)))
