"""Every doctor check for one node, in order; the daemon's checks only while it runs.

``run_doctor(config)`` returns the checks: key, data dir, listen addresses, each bootstrap
address, model, disk and memory, GPU, then reachability, NAT status (AutoNAT's verdict and
any relay reservation) and clock offset from the running
daemon (skipped, saying so, when it is stopped: ``symphony node run`` starts it).

A running daemon is judged by what it was started with (its ``/status`` ``started_with``: the
listen addresses, bootstrap peers and network id its flags, environment and node.toml gave
it), not by doctor's own reading of the config, which lacks the daemon's flags; a setting
given to doctor itself (``given``: the flags on its command line) still wins.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

import trio

from node.config import Config
from node.control import ApiClient, DaemonNotRunning
from node.doctor.local import (
    data_dir_check,
    gpu_check,
    key_check,
    listen_checks,
    model_check,
    resources_check,
)
from node.doctor.network import clock_check, nat_check, probe_bootstrap, reachability_check
from node.doctor.report import SKIP, Check

DAEMON_CHECKS = ("reachability", "nat", "clock")


#: the settings a running daemon reports it was started with, as Config fields
STARTED_WITH = ("listen", "bootstrap", "network_id")


def run_doctor(config: Config, *, check_model: bool = True,
               given: Collection[str] = ()) -> list[Check]:
    client, why_not = _client(config)
    status = client.status() if client is not None else None
    if status is not None:
        config = as_started(config, status, given)
    checks = [key_check(config.key_path), data_dir_check(config.data_dir)]
    checks += listen_checks(config.listen, status["addresses"] if status else None)
    checks += bootstrap_checks(config)
    executor = config.sections.get("executor")
    model_bytes = 0
    if check_model:
        model, model_bytes = model_check(executor)
        checks.append(model)
    else:
        checks.append(Check("model", SKIP, "not loaded (--skip-model)", "run without it"))
    checks += [resources_check(config.data_dir, model_bytes), gpu_check()]
    if client is None or status is None:
        fix = f"start it: symphony node run --data-dir {config.data_dir}"
        checks += [Check(name, SKIP, f"needs the running daemon ({why_not})", fix)
                   for name in DAEMON_CHECKS]
    else:
        checks += daemon_checks(client, status)
    return checks


def as_started(config: Config, status: dict[str, Any], given: Collection[str]) -> Config:
    """``config`` with the settings the running daemon was started with, except those in
    ``given``; a malformed report changes nothing."""
    started = status.get("started_with")
    if not isinstance(started, dict):
        return config
    changes: dict[str, Any] = {}
    for key in STARTED_WITH:
        value = started.get(key)
        if key in given or value is None:
            continue
        if key == "network_id" and isinstance(value, str):
            changes[key] = value
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            changes[key] = tuple(value)
    return replace(config, **changes)


def _client(config: Config) -> tuple[ApiClient | None, str]:
    try:
        return ApiClient(config.data_dir), ""
    except DaemonNotRunning as exc:
        return None, str(exc).split(";")[0]


def bootstrap_checks(config: Config) -> list[Check]:
    if not config.bootstrap:
        return [Check("bootstrap", "pass", "none configured: this node reconnects to the peers "
                      "it stored, or waits to be dialled")]

    async def probe_all() -> list[Check]:
        return [await probe_bootstrap(addr, config.network_id) for addr in config.bootstrap]

    return trio.run(probe_all)


def daemon_checks(client: ApiClient, status: dict[str, Any]) -> list[Check]:
    ledger = status.get("services", {}).get("ledger", {})
    try:
        peers = client.get("/ledger/peers")
    except DaemonNotRunning as exc:
        return [reachability_check(status), nat_check(status),
                Check("clock", SKIP, f"the daemon stopped answering: {exc}", "run doctor again")]
    return [reachability_check(status), nat_check(status),
            clock_check(peers, ledger.get("rejections", {}))]
