"""Every doctor check for one node, in order; the daemon's checks only while it runs.

``run_doctor(config)`` returns the checks: key, data dir, listen addresses, each bootstrap
address, model, disk and memory, GPU, then reachability, NAT status (AutoNAT's verdict and
any relay reservation) and clock offset from the running
daemon (skipped, saying so, when it is stopped: ``symphony node run`` starts it).
"""

from __future__ import annotations

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


def run_doctor(config: Config, *, check_model: bool = True) -> list[Check]:
    client, why_not = _client(config)
    status = client.status() if client is not None else None
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
