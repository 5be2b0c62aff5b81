"""How a feature plugs into the daemon: a Service owns one protocol machine.

The driver (node/driver.py) gives every service a ``NodeContext`` and then:

* routes each decoded message whose type is in ``message_types`` (unicast or gossip on one of
  ``topics``) to the service's machine as ``Received``; peer connect/disconnect events go to
  every machine; ``Tick`` goes to a machine when its ``next_deadline()`` has passed;
* performs the common effects (``Send``, ``Publish``, ``Dial``, ``Disconnect``, ``Penalize``,
  ``Emit`` from protocol/machine.py) itself and hands every other effect to the service's
  ``perform`` (e.g. write a record to SQLite, start a model computation);
* lets code outside the machine feed it a local event with ``ctx.submit(name, event)``, e.g.
  an HTTP handler submitting "ask this question", or a finished computation.

A service whose effects start background work (a model computation, a chunk transfer) derives
from ``NurseryService``, which owns a nursery for that work and reports ``started`` once it is
open.

A service must never raise out of ``perform`` for a peer's fault: it emits, penalizes, and goes
on. Its ``schema`` (``CREATE TABLE IF NOT EXISTS ...``) is applied at start, before ``start``
loads state from the database, and before the node connects to anyone.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from crypto.keys import Identity
from node.db import Database
from protocol.codec import Message
from protocol.machine import Machine

if TYPE_CHECKING:
    from starlette.routing import BaseRoute


async def _nothing_queued(name: str, peer: str) -> None:
    """``NodeContext.drained`` of a context without a driver's outboxes (tests)."""


@dataclass(frozen=True)
class NodeContext:
    identity: Identity
    network_id: str
    data_dir: Path
    config: Any  # node.config.Config (frozen); Any to keep this module import-light
    db: Database
    transport: Any  # node.transport.Transport
    log: Any  # structlog BoundLogger with peer_id bound
    rng: random.Random
    #: milliseconds on the daemon's clock (monotonic-based, comparable across services)
    clock: Callable[[], int]
    #: feed a local event to service NAME's machine and perform the resulting effects
    submit: Callable[[str, object], Awaitable[None]]
    #: every service by name, so one can query another (tasks asks the ledger for peers)
    services: Mapping[str, Service]
    #: ``await drained(NAME, PEER)``: until what service NAME sent PEER so far is delivered
    #: or failed (node/runtime/unicast.py); streaming paces itself by it
    drained: Callable[[str, str], Awaitable[None]] = _nothing_queued


class Service(ABC):
    name: ClassVar[str]
    message_types: ClassVar[tuple[type[Message], ...]] = ()
    topics: ClassVar[tuple[str, ...]] = ()
    schema: ClassVar[str] = ""
    #: a frozen dataclass of this service's settings with defaults; read from the TOML table
    #: ``[<name>]`` and ``SYMPHONY_<NAME>__<KEY>``; the instance is ``ctx.config.section(name)``
    config_section: ClassVar[type | None] = None

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    @property
    @abstractmethod
    def machine(self) -> Machine: ...

    async def start(self) -> None:  # noqa: B027 (an optional hook)
        """Load state from the database. Runs before the transport accepts peers."""

    async def perform(self, effect: object) -> None:
        """Perform a machine-specific effect; the common ones never reach here."""
        raise NotImplementedError(f"{self.name} cannot perform {type(effect).__name__}")

    def performing(self) -> AbstractContextManager[object]:
        """Wraps the performing of one event's effects when this service gets two or more.

        The driver enters it around the whole list, so a service can group them, e.g. write
        a pulled batch of records in one SQLite transaction instead of one per record.
        """
        return nullcontext()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background work for the life of the daemon (optional)."""
        task_status.started()

    def status(self) -> dict[str, Any]:
        return {}

    def routes(self) -> list[BaseRoute]:
        """HTTP routes mounted under ``/<name>``."""
        return []

    def root_routes(self) -> list[BaseRoute]:
        """HTTP routes mounted at the root (for well-known paths such as ``/v1/...``)."""
        return []


class NurseryService(Service):
    """A service that runs work in a nursery of its own for the life of the daemon.

    ``run`` opens the nursery, awaits :meth:`on_running` (e.g. to feed restored state to the
    machine), reports ``started`` and then sleeps until the daemon cancels it, which cancels
    the work too. :meth:`start_soon` runs work there; until ``run`` has opened the nursery,
    :attr:`running` is false and ``start_soon`` raises ``RuntimeError``.
    """

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._nursery: trio.Nursery | None = None

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.on_running()
            task_status.started()
            await trio.sleep_forever()

    async def on_running(self) -> None:  # noqa: B027 (an optional hook)
        """Runs once the nursery is open, before ``started`` is reported."""

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError(f"the {self.name} service is not running")
        self._nursery.start_soon(fn, *args)


class JobScopes:
    """The cancel scopes of a service's running jobs (computations, checks), by job key:
    ``open`` one as a job starts, ``cancel`` it when the machine says so, ``close`` it as the
    job ends (a key no longer open is ignored: the job ended or was cancelled already)."""

    def __init__(self) -> None:
        self._scopes: dict[object, trio.CancelScope] = {}

    def open(self, key: object) -> trio.CancelScope:
        scope = self._scopes[key] = trio.CancelScope()
        return scope

    def cancel(self, key: object) -> None:
        scope = self._scopes.pop(key, None)
        if scope is not None:
            scope.cancel()

    def close(self, key: object) -> None:
        self._scopes.pop(key, None)
