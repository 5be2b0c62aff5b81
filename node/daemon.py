"""The daemon: one process, one data dir, one root nursery, every service.

Registering a service
---------------------
``SERVICES`` below maps a service name to ``"module:Class"`` (a ``node.service.Service``
subclass whose ``name`` equals the key). The daemon imports them lazily, in this order, builds
each with the shared ``NodeContext``, applies its ``schema``, awaits its ``start()``, hands it
to the driver, and after the transport listens runs ``await nursery.start(service.run)``.
Its ``config_section`` dataclass becomes the ``[name]`` config table. Add one line per service.

Lifecycle (``Daemon.run``)
--------------------------
1. data dir: created on first run (mode 0700) with the key (``node.key``, 0600), a commented
   ``node.toml``, ``api.token`` (0600) and the SQLite DB (WAL);
2. services built and started (state loaded) before anyone can connect;
3. transport listening, driver running, services' ``run`` tasks, local HTTP API;
4. ``daemon.json`` written: clients (``symphony node status``) and tests find the node by it;
5. ``stop()`` (first SIGINT/SIGTERM): services, driver and API are cancelled, then the
   transport closes its connections gracefully; ``daemon.json`` is removed. See
   :func:`run_daemon` for the signal handling and the forced exit.
"""

from __future__ import annotations

import os
import platform
import random
import signal
import sys
import threading
import time
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import trio

from crypto.keys import Identity, load_identity, save_identity
from node import plugins
from node.api.app import build_app, serve_api
from node.api.dashboard import Dashboard
from node.api.dashboard_state import LiveFeed
from node.api.metrics import NodeMetrics
from node.api.observed import ObservedDriver
from node.api.token import load_or_create_token
from node.config import Config, default_toml
from node.control import remove_daemon_info, write_daemon_info
from node.db import Database
from node.driver import Driver
from node.logs import get_logger
from node.membership.service import agent_version
from node.p2p.link import parse_link
from node.p2p.natconfig import NatConfig
from node.runtime.limits import NetLimits
from node.service import NodeContext, Service
from protocol.names import PROTOCOL_VERSION

#: service name -> "module:Class", started in this order (see the module docstring).
SERVICES: dict[str, str] = {
    "membership": "node.membership.service:MembershipService",
    "discovery": "node.membership.discovery:DiscoveryService",
    "ledger": "node.ledger.service:LedgerService",
    "tasks": "node.market.requester:TasksService",
    "executor": "node.market.executor:ExecutorService",
    "relay": "node.relay.service:RelayService",
    "verify": "node.verification.service:VerifyService",
    "inference": "node.inference.service:InferenceService",
    "rl_worker": "node.rl.rollout_worker:RolloutWorkerService",
    "rl_jobs": "node.rl.rollout_jobs:RolloutJobsService",
}

#: the services of a light daemon (``symphony node run --light``): membership, discovery, the
#: ledger and the weight relay. None of them loads a model (no torch or llama.cpp import), so
#: many such daemons fit on one machine: large local testnets and ``bench scale``.
LIGHT_SERVICES = ("membership", "discovery", "ledger", "relay")
#: a light daemon's section defaults where they differ from a full one's (the TOML file and
#: the environment still win; node/config.py ``profile``): the one place a light daemon's
#: idle cadence is set. Many light daemons share one machine, and each periodic check costs a
#: little CPU in every one of them, so each runs as often as what it watches changes there:
#: * membership: pings every 15 s (a closed connection is an event; pings catch only silent
#:   ones, dropped after four missed), a peer exchange every 30 s;
#: * ledger: what the node offers is polled every 10 s: a light node runs no executor, so only
#:   its addresses (a relay reservation) can change it;
#: * nat: the NAT loop looks every 5 s for a new peer to ask for AutoNAT and for a
#:   reservation to make or refresh (reservations last an hour, refreshed 5 min early).
LIGHT_PROFILE: dict[str, dict[str, Any]] = {
    "membership": {"ping_interval_ms": 15_000, "unresponsive_after_ms": 60_000,
                   "exchange_interval_ms": 30_000},
    "ledger": {"capability_poll_ms": 10_000},
    "nat": {"tick_s": 5.0},
}

#: after the first signal the daemon must be gone within this long, or it exits forcibly
SHUTDOWN_DEADLINE_S = 4.5
#: exit status when shutdown was forced (second signal, or the deadline passed)
EXIT_FORCED = 3
DATA_DIR_MODE = 0o700


def load_service_classes(names: Mapping[str, str] | None = None) -> dict[str, type[Service]]:
    classes: dict[str, type[Service]] = {}
    for name, target in (SERVICES if names is None else names).items():
        cls = plugins.load(target)
        if getattr(cls, "name", None) != name:
            raise RuntimeError(f"SERVICES[{name!r}] points at {target} whose name is {cls.name!r}")
        classes[name] = cls
    return classes


def light_services() -> dict[str, str]:
    """``SERVICES`` restricted to ``LIGHT_SERVICES``, in the same order."""
    return {name: target for name, target in SERVICES.items() if name in LIGHT_SERVICES}


def load_extra_services(targets: tuple[str, ...]) -> dict[str, type[Service]]:
    """Classes named by ``config.extra_services``; they may not declare a config section."""
    classes: dict[str, type[Service]] = {}
    for target in targets:
        cls = plugins.load(target)
        if cls.config_section is not None:
            raise RuntimeError(f"extra service {target} declares a config section; register "
                               "it in node/daemon.py SERVICES instead")
        classes[cls.name] = cls
    return classes


#: the config section of the network limits
LIMITS_SECTION = "limits"
#: the config section of NAT traversal: AutoNAT, circuit relay, hole punching
NAT_SECTION = "nat"


def config_sections(classes: Mapping[str, type[Service]]) -> dict[str, type]:
    """Every config section: each service's, and ``[limits]`` (node/runtime/limits.py)."""
    return {LIMITS_SECTION: NetLimits, NAT_SECTION: NatConfig,
            **{name: cls.config_section for name, cls in classes.items()
               if cls.config_section is not None}}


def prepare_data_dir(data_dir: Path, sections: Mapping[str, type] | None = None) -> Identity:
    """Create the data dir on first run (key, config template, token); return the identity."""
    data_dir.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
    key_path = data_dir / "node.key"
    if key_path.exists():
        identity = load_identity(key_path)
    else:
        identity = Identity.generate()
        save_identity(identity, key_path)
    config_path = data_dir / "node.toml"
    if not config_path.exists():
        config_path.write_text(default_toml(sections))
    load_or_create_token(data_dir)
    return identity


def versions() -> dict[str, str | int]:
    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "unknown"

    return {"agent": agent_version(), "protocol": PROTOCOL_VERSION, "libp2p": of("libp2p"),
            "python": platform.python_version()}


class Daemon:
    def __init__(self, config: Config, classes: Mapping[str, type[Service]] | None = None) -> None:
        self.config = config
        self.classes = dict(load_service_classes() if classes is None else classes)
        self.stopping = False
        self._stop = trio.Event()
        self._started_at = time.time()
        self._started_ms = 0
        self.driver: Driver | None = None
        self.transport: Any = None
        self.api_port: int | None = None

    def stop(self) -> None:
        self.stopping = True
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from node.p2p.host import P2PTransport  # the only libp2p import; kept out of `--help`

        config = self.config
        identity = prepare_data_dir(config.data_dir, config_sections(self.classes))
        log = self.log = get_logger(peer_id=identity.peer_id)
        db = Database(config.db_path)
        limits = config.sections.get(LIMITS_SECTION) or NetLimits()
        self.transport = transport = P2PTransport(
            identity.seed, listen=config.listen, limits=limits,
            nat=config.sections.get(NAT_SECTION) or NatConfig(), link=parse_link(config.link))
        self.driver = driver = ObservedDriver(transport, network_id=config.network_id,
                                              log=log, limits=limits)
        self._started_ms = driver.now_ms()
        # what the local API shows beyond /status: Prometheus metrics and the dashboard
        self.metrics = NodeMetrics(driver, {"peer_id": identity.peer_id,
                                            "network_id": config.network_id,
                                            "version": agent_version()})
        feed = LiveFeed(driver.now_ms)
        driver.observers += [self.metrics.observe, feed.observe]
        ctx = NodeContext(
            identity=identity, network_id=config.network_id, data_dir=config.data_dir,
            config=config, db=db, transport=transport, log=log,
            rng=random.Random(int.from_bytes(os.urandom(16), "big")),
            clock=driver.now_ms, submit=driver.submit, services=driver.services,
            drained=driver.drained,
        )
        try:
            for cls in self.classes.values():
                service = cls(ctx)
                if service.schema:
                    db.apply_schema(service.schema)
                await service.start()
                driver.add_service(service)
            driver.install()
            async with trio.open_nursery() as root:
                await root.start(transport.run)
                async with trio.open_nursery() as work:
                    await work.start(driver.run)
                    for service in driver.services.values():
                        await work.start(service.run)
                    services = driver.services.values()
                    app = build_app(self.status, {s.name: s.routes() for s in services},
                                    load_or_create_token(config.data_dir),
                                    [self.metrics.route(), *Dashboard(self, feed).routes(),
                                     *(r for s in services for r in s.root_routes())])
                    self.api_port = await work.start(serve_api, app, config.api_port)
                    self._write_daemon_file()
                    log.info("daemon.ready", addrs=transport.listen_addrs(),
                             api=f"http://127.0.0.1:{self.api_port}",
                             network_id=config.network_id, services=list(driver.services))
                    task_status.started()
                    await self._stop.wait()
                    log.info("daemon.stopping")
                    work.cancel_scope.cancel()
                transport.stop()
        finally:
            remove_daemon_info(config.data_dir, os.getpid())
            db.close()
        log.info("daemon.stopped")

    def _write_daemon_file(self) -> None:
        assert self.transport is not None  # our own sequencing, not peer data
        write_daemon_info(self.config.data_dir, {
            "pid": os.getpid(),
            "api_url": f"http://127.0.0.1:{self.api_port}",
            "api_port": self.api_port,
            "peer_id": self.transport.peer_id,
            "network_id": self.config.network_id,
            "addresses": self.transport.listen_addrs(),
            "started_at": self._started_at,
        })

    @property
    def services(self) -> Mapping[str, Service]:
        return self.driver.services if self.driver is not None else {}

    def status(self) -> dict[str, Any]:
        driver, transport = self.driver, self.transport
        if driver is None or transport is None:
            return {"state": "starting"}
        services = {name: s.status() for name, s in driver.services.items()}
        membership = services.pop("membership", {})
        drv = driver.status()
        return {
            "peer_id": transport.peer_id,
            "network_id": self.config.network_id,
            "addresses": transport.listen_addrs(),
            # what it was started with (flags, environment, node.toml): `symphony doctor`
            # judges the running daemon by these, not by its own reading of the config
            "started_with": {"listen": list(self.config.listen),
                             "bootstrap": list(self.config.bootstrap),
                             "network_id": self.config.network_id},
            "pid": os.getpid(),
            "uptime_s": round((driver.now_ms() - self._started_ms) / 1000, 3),
            "started_at": self._started_at,
            "versions": versions(),
            "peers": membership.get("peers", [
                {"peer_id": p, **s} for p, s in drv["connected"].items()]),
            "dropped": membership.get("dropped", []),
            "known_peers": membership.get("known_peers", 0),
            "stored_peers": membership.get("stored_peers", 0),
            "mdns": membership.get("mdns", {}),
            "target_peers": self.config.target_peers,
            "penalties": drv["penalties"],
            "penalized_peers": drv["penalized_peers"],
            "banned": drv["banned"],
            "banned_peers": drv["banned_peers"],
            "counters": drv["counters"],
            "faults": drv["faults"],
            "log_lines_suppressed": drv["log_lines_suppressed"],
            "gossip_dropped": getattr(transport, "gossip_dropped", 0),
            "gossip_received": getattr(transport, "gossip_received", {}),
            # our requests' streams: opened, reused, retried, closed idle (node/p2p/reqresp.py)
            "request_streams": dict(getattr(getattr(transport, "requests", None), "counts", {})),
            "nat": transport.nat.status() if getattr(transport, "nat", None) else {},
            "services": services,
        }


def run_daemon(config: Config, classes: Mapping[str, type[Service]] | None = None) -> int:
    """Run a daemon in this process until a signal stops it; returns the exit status.

    The first SIGINT/SIGTERM starts a graceful shutdown; a second one, or the shutdown taking
    longer than SHUTDOWN_DEADLINE_S, ends the process at once with EXIT_FORCED.
    """
    daemon = Daemon(config, classes)
    forced = threading.Timer(SHUTDOWN_DEADLINE_S, _force_exit, args=("shutdown deadline",))
    forced.daemon = True

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def body() -> None:
                    try:
                        await daemon.run()
                    finally:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(body)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if daemon.stopping:
                        _force_exit(f"second {name}")
                    get_logger().info("daemon.signal", signal=name)
                    forced.start()
                    daemon.stop()

    try:
        trio.run(main)
    except Exception as exc:
        if not daemon.stopping:
            raise
        # A stop was asked for and the data is safe (SQLite commits are atomic): an error
        # while tearing down connections to peers that are stopping too is logged, with its
        # traceback, but does not make the stop unclean.
        get_logger().warning("daemon.error_during_shutdown", error=repr(exc), exc_info=exc)
    finally:
        forced.cancel()
    return 0


def _force_exit(why: str) -> None:
    get_logger().warning("daemon.forced_exit", why=why)
    sys.stderr.flush()
    os._exit(EXIT_FORCED)
