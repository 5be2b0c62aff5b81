"""Client side of the local API: find the daemon that owns a data dir and call it.

A running daemon writes ``<data_dir>/daemon.json`` (pid, API URL, peer id, addresses),
atomically, once it is ready, and removes it on a clean exit. A file left by a killed daemon
is recognised as stale because its pid is no longer alive (or is not answering the API).

    client = ApiClient(data_dir)          # raises DaemonNotRunning with a clear message
    client.get("/status")
    client.post("/ledger/publish", json={...})   # sends the bearer token from api.token
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from node.api.token import read_token

DAEMON_FILE_NAME = "daemon.json"
#: how long a CLI call waits for the daemon to answer
CLIENT_TIMEOUT_S = 10.0
#: how long an idle kept-alive connection to the daemon is reused: well under the server's
#: keep-alive timeout (node/api/app.py KEEP_ALIVE_S), so the client always drops it first
KEEPALIVE_S = 2.0


def tls_verify(url: str) -> bool:
    """httpx's ``verify`` for a request to ``url``: the certificate is checked on https; a
    plain-http URL (the daemon's loopback API) has none, and httpx would otherwise load the
    CA bundle for every request, which a CLI call or a benchmark's ask pays each time."""
    return not url.startswith("http://")


class DaemonNotRunning(Exception):
    """No live daemon owns this data dir."""


def refusal(exc: httpx.HTTPStatusError) -> str:
    """What the daemon said when it refused a call: the ``error`` of its JSON answer (or that
    error's ``message``), else the answer's text."""
    try:
        answer = exc.response.json()
    except ValueError:
        return exc.response.text
    detail = answer.get("error") if isinstance(answer, dict) else answer
    if isinstance(detail, dict):
        detail = detail.get("message")
    return str(detail)


@dataclass(frozen=True)
class DaemonInfo:
    pid: int
    api_url: str
    peer_id: str
    network_id: str
    addresses: tuple[str, ...]


def daemon_file(data_dir: Path) -> Path:
    return Path(data_dir) / DAEMON_FILE_NAME


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def write_daemon_info(data_dir: Path, info: dict[str, Any]) -> None:
    """Write daemon.json atomically (readers never see half a file)."""
    path = daemon_file(data_dir)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True))
    os.replace(tmp, path)


def remove_daemon_info(data_dir: Path, pid: int) -> None:
    """Remove daemon.json if it is ours (a newer daemon may have replaced it)."""
    path = daemon_file(data_dir)
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def read_daemon_info(data_dir: Path) -> DaemonInfo:
    path = daemon_file(data_dir)
    try:
        raw = json.loads(path.read_text())
        info = DaemonInfo(pid=int(raw["pid"]), api_url=str(raw["api_url"]),
                          peer_id=str(raw["peer_id"]), network_id=str(raw["network_id"]),
                          addresses=tuple(raw["addresses"]))
    except FileNotFoundError:
        raise DaemonNotRunning(
            f"no daemon is running for data dir {data_dir} (no {path.name}); "
            f"start one: symphony node run --data-dir {data_dir}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DaemonNotRunning(f"{path} is unreadable ({exc}); is a daemon starting?") from None
    if not pid_alive(info.pid):
        raise DaemonNotRunning(
            f"the daemon for {data_dir} (pid {info.pid}) is not running; {path.name} is stale "
            "(it was killed); start it again: symphony node run") from None
    return info


class ApiClient:
    """Calls one daemon's API over one ``httpx.Client``: its calls reuse a kept-alive
    connection instead of setting up a client and a connection each. An idle connection is
    dropped after ``KEEPALIVE_S``, well before the daemon's server would close it
    (node/api/app.py ``KEEP_ALIVE_S``), so a call never goes out on a connection the server
    is closing at that moment (which would reset it, and a POST cannot safely be sent again).
    ``close()`` (or ``with``) releases the connection; the last reference going does too."""

    def __init__(self, data_dir: Path, *, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.data_dir = Path(data_dir)
        self.info = read_daemon_info(self.data_dir)
        self._http = httpx.Client(timeout=timeout_s, verify=tls_verify(self.info.api_url),
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S))

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, self.info.api_url + path, **kwargs)
        except httpx.TransportError as exc:
            if not pid_alive(self.info.pid):
                raise DaemonNotRunning(f"the daemon (pid {self.info.pid}) exited") from None
            raise DaemonNotRunning(
                f"the daemon (pid {self.info.pid}) does not answer at {self.info.api_url}: "
                f"{exc}") from None
        response.raise_for_status()
        return response.json()

    def get(self, path: str) -> Any:
        return self._request("GET", path)

    def post(self, path: str, json: Any = None) -> Any:
        token = read_token(self.data_dir)
        return self._request("POST", path, json=json,
                             headers={"Authorization": f"Bearer {token}"})

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/status")
        return result
