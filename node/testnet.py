"""Real daemons as child processes on this machine: `symphony testnet`, `symphony demo`, tests.

Each :class:`NodeProcess` is one ``symphony node run`` in its own data dir, listening on
127.0.0.1 port 0 with an ephemeral API port, JSON logs to ``<data_dir>/daemon.log``. Readiness
is read from ``daemon.json`` (written by the daemon once it is ready) and ``GET /status``;
every wait is bounded and raises :class:`TestnetError` naming what it waited for.

    net = LocalTestnet(base_dir, network_id="demo")
    a = net.start("a")
    b = net.start("b", bootstrap=[a])          # B dials A's full multiaddr
    net.wait_until(lambda: len(b.ready_peers()) == 1, "b sees a")
    a.kill()                                   # SIGKILL, like a crash
    a.restart()                                # same data dir: same key, same peer id
    net.stop_all()                             # SIGTERM, then bounded wait, then SIGKILL

A testnet made with ``link="rtt=60ms,up=20mbit"`` writes that spec into every node's config
(``link``, node/p2p/link.py), so each daemon it starts shapes all of its connections alike: the
one place a testnet, a bench or a test puts its daemons behind a link.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from node.control import daemon_file
from node.p2p.link import parse_link

#: default bound on waiting for one daemon to be ready (imports and the libp2p start, on cores
#: other daemons share)
READY_TIMEOUT_S = 60.0
#: a graceful stop (SIGTERM) must finish within this long
STOP_TIMEOUT_S = 10.0
#: how often conditions on other processes are re-checked (files, HTTP): there is no event
POLL_INTERVAL_S = 0.1
LOOPBACK_LISTEN = "/ip4/127.0.0.1/tcp/0"
#: under every node's config: nodes of a local testnet find each other by bootstrap, and mDNS
#: would also find every other testnet of the same network id on this machine (a config that
#: sets ``[membership] mdns = true`` turns it on)
QUIET: dict[str, Any] = {"membership": {"mdns": False}}
#: membership timings for a test network of daemons on one machine (tests, benches): pings
#: every second, a peer exchange every half second, redials backed off from 200 ms to 2 s, so
#: daemons find each other and recover from a restart in seconds rather than the defaults'
#: tens of seconds. Pass it as a testnet's ``config`` (or merge it with other sections); the
#: one copy of these settings, read only.
FAST_MEMBERSHIP: dict[str, Any] = {
    "membership": {
        "ping_interval_ms": 1000,
        "exchange_interval_ms": 500,
        "backoff_base_ms": 200,
        "backoff_max_ms": 2000,
    }
}


class TestnetError(Exception):
    """A daemon did not start, answer, or reach a condition in time."""


def wait_until(predicate: Callable[[], Any], what: str, *, timeout_s: float,
               on_timeout: Callable[[], str] | None = None,
               interval_s: float = POLL_INTERVAL_S) -> Any:
    """Poll ``predicate`` every ``interval_s`` until it returns a truthy value (returned) or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = on_timeout() if on_timeout else ""
            raise TestnetError(f"timed out after {timeout_s} s waiting for {what}"
                               + (f" (last error: {last_error!r})" if last_error else "")
                               + (f"\n{detail}" if detail else ""))
        time.sleep(interval_s)


class NodeProcess:
    def __init__(self, name: str, data_dir: Path, args: Sequence[str],
                 env: Mapping[str, str] | None = None,
                 command: Sequence[str] = ("node", "run"),
                 wrapper: Sequence[str] = ()) -> None:
        self.name = name
        #: a command the daemon runs under, e.g. ``ip netns exec NS`` (it must exec, keeping
        #: the process id)
        self.wrapper = tuple(wrapper)
        #: the `symphony` subcommand that runs the daemon (`join INVITE` runs one too)
        self.command = tuple(command)
        self.data_dir = data_dir
        self.args = list(args)
        self.env = dict(env or {})
        self.log_path = data_dir / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self._stop_sent = False

    # ---- process control ------------------------------------------------------------------

    def spawn(self) -> NodeProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        # the checkout this module runs from, so children import the same code installed or not
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        env.pop("SYMPHONY_DATA_DIR", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                [*self.wrapper, sys.executable, "-c", "from node.cli.main import main; main()",
                 *self.command,
                 "--data-dir", str(self.data_dir), *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()
        self.info = {}
        self._stop_sent = False
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> NodeProcess:
        """Wait until this process has written daemon.json and answers GET /status."""

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise TestnetError(f"node {self.name} exited with {self.proc.returncode} "
                                   f"before it was ready\n{self.log_tail()}")
            info = json.loads(daemon_file(self.data_dir).read_text())
            if self.proc is None or info.get("pid") != self.proc.pid:
                return False
            self.info = info
            return bool(self.status().get("peer_id"))

        wait_until(ready, f"node {self.name} to be ready", timeout_s=timeout_s,
                   on_timeout=self.log_tail)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash: no cleanup runs, daemon.json stays behind (stale)."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def send_stop(self, sig: int = signal.SIGTERM) -> None:
        """Ask the daemon to stop (once: a second signal would force its exit)."""
        if self.running and not self._stop_sent:
            assert self.proc is not None
            self._stop_sent = True
            self.proc.send_signal(sig)

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (unless already sent), then wait at most ``timeout_s``; returns the exit code (kills if it hangs)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.send_stop()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise TestnetError(f"node {self.name} did not stop within {timeout_s} s "
                                   f"after SIGTERM\n{self.log_tail()}") from None
        return self.proc.returncode

    def restart(self, timeout_s: float = READY_TIMEOUT_S) -> NodeProcess:
        """Start again on the same data dir (same key, same peer id) and wait until ready."""
        if self.running:
            self.terminate()
        return self.spawn().wait_ready(timeout_s)

    # ---- what the daemon says -------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return str(self.info["peer_id"])

    @property
    def addresses(self) -> list[str]:
        return list(self.info["addresses"])

    @property
    def api_url(self) -> str:
        return str(self.info["api_url"])

    def status(self) -> dict[str, Any]:
        response = httpx.get(self.api_url + "/status", timeout=5.0)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def ready_peers(self) -> set[str]:
        return {p["peer_id"] for p in self.status()["peers"] if p["state"] == "ready"}

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The daemon's JSON log lines (optionally only those whose event is ``event``)."""
        out = []
        for line in self.log_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (event is None or record.get("event") == event):
                out.append(record)
        return out

    def log_tail(self, lines: int = 40) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- last {len(tail)} log lines of node {self.name} ({self.log_path}) ---\n" + \
            "\n".join(tail)


class LocalTestnet:
    """Several NodeProcesses under one base dir; all share a network id unless told not to,
    and all run behind ``link`` (a link spec; "" is none) whatever their own config says.
    With ``light`` every node runs ``node run --light`` (node/daemon.py LIGHT_SERVICES: no
    model is loaded)."""

    def __init__(self, base_dir: Path, *, network_id: str = "localtest",
                 config: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None,
                 listen: str = LOOPBACK_LISTEN, link: str = "", light: bool = False) -> None:
        parse_link(link)  # a bad spec fails here (LinkSpecError names the part), not in a child
        #: the link spec every node's config gets
        self.link = link
        self.base_dir = Path(base_dir)
        #: what every node listens on (``/ip4/0.0.0.0/tcp/0``: reachable from other machines)
        self.listen = listen
        self.network_id = network_id
        self.config = dict(config or {})
        self.env = dict(env or {})
        self.light = light
        self.nodes: dict[str, NodeProcess] = {}

    def start(self, name: str, *, bootstrap: Iterable[NodeProcess | str] = (),
              network_id: str | None = None, config: Mapping[str, Any] | None = None,
              env: Mapping[str, str] | None = None, extra_args: Sequence[str] = (),
              wait: bool = True, timeout_s: float = READY_TIMEOUT_S) -> NodeProcess:
        """Start node ``name`` in ``base_dir/name``; ``config`` is merged over the testnet's
        and written as node.toml (sections as nested dicts); bootstrap takes nodes or addrs."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} exists; use restart()")
        data_dir = self.write_config(name, config or {})
        args = ["--listen", self.listen, "--network-id", network_id or self.network_id,
                "--json-logs", *(["--light"] if self.light else []), *extra_args]
        for peer in bootstrap:
            args += ["--bootstrap", peer.addresses[0] if isinstance(peer, NodeProcess) else peer]
        node = NodeProcess(name, data_dir, args, {**self.env, **(env or {})})
        self.nodes[name] = node
        node.spawn()
        return node.wait_ready(timeout_s) if wait else node

    def start_batches(self, names: Sequence[str], *, bootstrap: Iterable[NodeProcess | str] = (),
                      batch: int = 8, timeout_s: float = READY_TIMEOUT_S, spread: int = 0,
                      rng: random.Random | None = None,
                      on_batch: Callable[[int], None] | None = None) -> list[NodeProcess]:
        """Start nodes ``names`` ``batch`` at a time: each batch's processes are spawned
        together and all must be ready before the next batch starts, so start-up (imports,
        key, database) runs in parallel without every process competing for the cores at
        once. Each node bootstraps from ``bootstrap`` and, with ``spread``, from that many more
        nodes drawn by ``rng`` among those already running, so that no one node answers every
        newcomer's Hello. ``on_batch(started)`` is called after each batch."""
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        fixed = list(bootstrap)
        draw = rng or random.Random(0)
        started: list[NodeProcess] = [n for n in self.nodes.values() if n.running]
        for first in range(0, len(names), batch):
            pool = [n for n in started if n not in fixed]
            group = [self.start(name, wait=False, bootstrap=[
                *fixed, *draw.sample(pool, min(spread, len(pool)))])
                for name in names[first:first + batch]]
            for node in group:
                node.wait_ready(timeout_s)
            started += group
            if on_batch is not None:
                on_batch(len(started))
        return started[len(started) - len(names):]

    def write_config(self, name: str, config: Mapping[str, Any]) -> Path:
        """Write node ``name``'s node.toml, returning its data dir: QUIET, under the testnet's
        config, under the node's own ``config``, and the testnet's link (when it has one)
        over all of them."""
        data_dir = self.base_dir / name
        data_dir.mkdir(parents=True, exist_ok=True)
        merged = _merge(_merge(QUIET, self.config), config)
        if self.link:
            merged["link"] = self.link
        (data_dir / "node.toml").write_text(tomli_w.dumps(merged))
        return data_dir

    def wait_until(self, predicate: Callable[[], Any], what: str,
                   timeout_s: float = READY_TIMEOUT_S,
                   interval_s: float = POLL_INTERVAL_S) -> Any:
        return wait_until(predicate, what, timeout_s=timeout_s, on_timeout=self.log_tails,
                          interval_s=interval_s)

    def wait_all_connected(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until every running node has every other running node as a ready peer."""
        def full_mesh() -> bool:
            running = [n for n in self.nodes.values() if n.running]
            ids = {n.peer_id for n in running}
            return all(n.ready_peers() >= ids - {n.peer_id} for n in running)

        self.wait_until(full_mesh, "every node to see every other", timeout_s)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, int]:
        """SIGTERM every node at once, then wait; returns name -> exit code."""
        for node in self.nodes.values():
            node.send_stop()
        return {name: node.terminate(timeout_s) for name, node in self.nodes.items()}

    def kill_all(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(n.log_tail(lines) for n in self.nodes.values())


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
